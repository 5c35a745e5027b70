"""Structured outputs in the engine on a tiny random model, whose unconstrained output is garbage: every answer
parses and validates against its schema (jsonschema, not our code), under greedy and seeded sampling, n > 1,
chunked prefill, preemption and prefix caching; constrained requests leave the free ones in their batch untouched.
"""

import json
import re

import jsonschema
import pytest

from rtp_llm.errors import RequestRejected
from rtp_llm.sampling import SamplingParams
from tests.engine.helpers import Tiny, greedy, run_all

PROMPT = [5, 17, 33, 9, 71, 12]

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "owner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                   "admin": {"type": "boolean"}},
                  "required": ["name", "admin"], "additionalProperties": False}},
        "required": ["id", "owner"], "additionalProperties": False},
    "array_enum": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
        "level": {"enum": [1, 2, 3]}},
        "required": ["colors", "level"], "additionalProperties": False},
    "numbers_pattern_optional": {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 100},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "note": {"type": "string", "maxLength": 5}},
        "required": ["price", "code"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # The whole tokenizer's vocabulary: a grammar may force a token only the full vocabulary has ("colors").
    return Tiny(tmp_path_factory.mktemp("tiny"), "llama_full_vocab")


def constrained(max_tokens=96, **kw):
    return SamplingParams(max_tokens=max_tokens, **kw)


def assert_valid(text, schema):
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_answer_validates_greedy_and_sampled(tiny, name):
    schema = SCHEMAS[name]
    engine = tiny.engine()
    free = run_all(engine, [(0, "free", PROMPT, greedy(40))])["free"].outputs[0].text
    with pytest.raises(json.JSONDecodeError):  # the model alone writes no JSON
        json.loads(free)
    arrivals = [(0, "greedy", PROMPT, constrained(temperature=0, structured_outputs={"json": schema})),
                (0, "sampled", PROMPT, constrained(temperature=1.0, seed=7, n=3, structured_outputs={"json": schema}))]
    done = run_all(engine, arrivals)
    outs = done["greedy"].outputs + done["sampled"].outputs
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert_valid(o.text, schema)
    assert len({o.text for o in done["sampled"].outputs}) > 1  # siblings sample their own answers
    assert engine.stats()["kv_used_blocks"] == 0


def test_regex_choice_and_grammars(tiny):
    engine = tiny.engine()
    cases = {
        "regex": ({"regex": r"[0-9]{3}-[a-z]{2,4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t)),
        "choice": ({"choice": ["alpha", "beta", "gamma delta"]}, lambda t: t in ("alpha", "beta", "gamma delta")),
        "gbnf": ({"grammar": 'root ::= "(" [a-c]+ ")" ("," "(" [a-c]+ ")")*'},
                 lambda t: re.fullmatch(r"\([a-c]+\)(,\([a-c]+\))*", t)),
        "lark": ({"grammar": 'start: "x=" NUM ";"\nNUM: /[1-9][0-9]?/'}, lambda t: re.fullmatch(r"x=[1-9][0-9]?;", t)),
    }
    arrivals = [(0, k, PROMPT, constrained(max_tokens=48, temperature=1.0, seed=3, structured_outputs=so))
                for k, (so, _) in cases.items()]
    done = run_all(engine, arrivals)
    for k, (_, ok) in cases.items():
        o = done[k].outputs[0]
        assert o.finish_reason == "stop" and ok(o.text), (k, o.text)


def test_free_requests_get_the_same_tokens_beside_constrained_ones(tiny):
    schema = SCHEMAS["nested"]
    prompts = [PROMPT, [40, 41, 42], [7] * 9]
    alone = {}
    for i, p in enumerate(prompts):
        for kind, params in (("g", greedy(20)), ("s", SamplingParams(max_tokens=20, temperature=0.8, seed=11 + i,
                                                                      ignore_eos=True))):
            alone[(i, kind)] = run_all(tiny.engine(), [(0, "a", p, params)])["a"].outputs[0].token_ids
    arrivals = []
    for i, p in enumerate(prompts):
        arrivals.append((i, f"g{i}", p, greedy(20)))
        arrivals.append((i, f"s{i}", p, SamplingParams(max_tokens=20, temperature=0.8, seed=11 + i, ignore_eos=True)))
        arrivals.append((0, f"c{i}", p, constrained(temperature=0.7, seed=i, structured_outputs={"json": schema})))
    done = run_all(tiny.engine(), arrivals)
    for i in range(len(prompts)):
        assert done[f"g{i}"].outputs[0].token_ids == alone[(i, "g")]
        assert done[f"s{i}"].outputs[0].token_ids == alone[(i, "s")]
        assert_valid(done[f"c{i}"].outputs[0].text, schema)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_and_chunked_prefill_keep_the_matcher_with_its_sequence(tiny, prefix_caching):
    """A small pool preempts constrained sequences mid-answer; their recompute carries on the same matcher, so each
    answer is the one it gives with room to spare (and valid)."""
    schema = SCHEMAS["array_enum"]
    prompts = [[(i * 11 + k * 5) % 240 + 3 for i in range(14)] for k in range(6)]
    params = [constrained(max_tokens=48, temperature=0.9, seed=k, structured_outputs={"json": schema})
              for k in range(6)]
    roomy = run_all(tiny.engine(), [(0, f"r{k}", p, params[k]) for k, p in enumerate(prompts)])
    engine = tiny.engine(num_blocks=30, max_model_len=64, max_prefill_chunk=5, enable_prefix_caching=prefix_caching)
    tight = run_all(engine, [(k, f"r{k}", p, params[k]) for k, p in enumerate(prompts)])
    assert engine.scheduler.num_preemptions > 0
    for k in range(6):
        assert tight[f"r{k}"].outputs[0].token_ids == roomy[f"r{k}"].outputs[0].token_ids
        assert_valid(tight[f"r{k}"].outputs[0].text, schema)
    assert engine.stats()["kv_used_blocks"] == 0


def test_the_constraint_starts_after_its_marker_tokens(tiny):
    """after_token_ids (the end of a reasoning part): the tokens up to the marker are the free answer's (same seed,
    same draws), the rest follows the grammar."""
    free = run_all(tiny.engine(), [(0, "f", PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=5,
                                                                   ignore_eos=True))])["f"].outputs[0].token_ids
    marker = tuple(free[2:4])
    assert marker not in {tuple(free[i:i + 2]) for i in range(2)}
    so = {"regex": "[0-9]{4}", "after_token_ids": marker}
    out = run_all(tiny.engine(), [(0, "c", PROMPT, SamplingParams(max_tokens=40, temperature=1.0, seed=5,
                                                                   structured_outputs=so))])["c"].outputs[0]
    assert out.token_ids[:4] == free[:4]
    rest = tiny.tokenizer.decode(out.token_ids[4:])
    assert re.fullmatch("[0-9]{4}", rest), rest


def test_stop_strings_and_max_tokens_still_end_a_constrained_answer(tiny):
    engine = tiny.engine()
    so = {"regex": "a+b+c+"}
    done = run_all(engine, [(0, "stop", PROMPT, constrained(max_tokens=40, temperature=1.0, seed=1, stop=["b"],
                                                            structured_outputs=so)),
                            (0, "len", PROMPT, constrained(max_tokens=3, temperature=0, structured_outputs=so))])
    stop, length = done["stop"].outputs[0], done["len"].outputs[0]
    assert stop.finish_reason == "stop" and stop.stop_reason == "b" and re.fullmatch("a+", stop.text)
    assert length.finish_reason == "length" and len(length.token_ids) == 3 and re.fullmatch("a+b*c*", length.text)


@pytest.mark.parametrize("so,words", [
    ({"json": {"type": "objekt"}}, "objekt"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"regex": "[a-z"}, "regex"),
    ({"grammar": "root ::= ( \"a\""}, "grammar"),
])
def test_a_constraint_that_cannot_compile_is_refused_before_the_engine(tiny, so, words):
    engine = tiny.engine()
    with pytest.raises(RequestRejected) as err:
        engine.add_request("bad", PROMPT, SamplingParams(max_tokens=4, structured_outputs=so))
    assert words in str(err.value) and err.value.param == "structured_outputs"
    assert not engine.has_unfinished()


def test_structured_outputs_takes_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs={})
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"jsonschema": {}})


def test_a_grammar_compiles_off_the_step_loop(tiny):
    """While a new grammar compiles (held here on its worker thread by a gate), free requests keep stepping to their
    end; the constrained one then runs. A request aborted while compiling, and one whose grammar fails in the
    engine (it skipped the caller's check), end cleanly with no blocks held."""
    import threading

    from rtp_llm.engine.protocol import EngineRequest

    engine = tiny.engine()
    gate = threading.Event()
    check = engine.core.grammars.check

    def held_check(so):
        gate.wait(30)
        return check(so)

    engine.core.grammars.check = held_check
    schema = SCHEMAS["array_enum"]
    engine.core.add_request(EngineRequest("c", PROMPT, constrained(temperature=0, structured_outputs={"json": schema})))
    engine.core.add_request(EngineRequest("gone", PROMPT, constrained(structured_outputs={"regex": "[a-z]+x"})))
    engine.add_request("f", [40, 41, 42], greedy(10))
    done, steps = {}, 0
    while "f" not in done:
        done.update({o.request_id: o for o in engine.step() if o.finished})
        steps += 1
        assert steps < 100
    assert "c" not in done and engine.core.admissions.waiting  # the free request finished while the grammar compiled
    engine.core.abort("gone")
    gate.set()
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert_valid(done["c"].outputs[0].text, schema)
    assert done["gone"].outputs[0].finish_reason == "abort"
    engine.core.grammars.check = check
    engine.core.add_request(EngineRequest("bad", PROMPT, constrained(structured_outputs={"regex": "[a-z"})))
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["bad"].outputs[0].finish_reason == "error" and "regex" in done["bad"].error
    assert engine.stats()["kv_used_blocks"] == 0
