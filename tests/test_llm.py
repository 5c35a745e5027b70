"""The offline API (LLM.generate / LLM.chat) and the asyncio client over an in-thread core, on the real embedded
model, against transformers on the same GGUF weights."""

import asyncio
import os

import pytest
import torch

from rtp_llm import LLM, SamplingParams
from rtp_llm.engine.client import ThreadEngineClient


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=1024, max_num_seqs=8)


@pytest.fixture(scope="module")
def hf(llm):
    from transformers import AutoModelForCausalLM

    gguf = llm.core.model_path
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32).eval()
    return model


def hf_greedy_ids(hf, ids, n, eos):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(ids):].tolist()


def test_generate_text_and_token_prompts_in_order(llm, hf):
    prompts = ["The capital of France is", [504, 3575, 282], "def fibonacci(n):"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [llm.tokenizer.encode(prompts[0]), prompts[1],
                                                   llm.tokenizer.encode(prompts[2])]
    for o in outs:
        ref = hf_greedy_ids(hf, o.prompt_token_ids, 24, eos=2)
        assert o.outputs[0].token_ids == ref
        assert o.outputs[0].text == llm.tokenizer.decode(ref)


def test_generate_takes_vllms_prompt_dicts(llm):
    """vLLM's TextPrompt / TokensPrompt forms give what the plain text and ids give; other keys are refused."""
    from rtp_llm.errors import RequestRejected

    params = SamplingParams(max_tokens=6, temperature=0)
    text, ids = "The capital of France is", [504, 3575, 282]
    plain = llm.generate([text, ids], params, use_tqdm=False)
    dicts = llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in dicts] == [o.outputs[0].token_ids for o in plain]
    assert [o.prompt_token_ids for o in dicts] == [o.prompt_token_ids for o in plain]
    single = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    assert single[0].outputs[0].token_ids == plain[1].outputs[0].token_ids
    with pytest.raises(RequestRejected, match="'prompt' \\(text\\) or 'prompt_token_ids' alone"):
        llm.generate({"prompt": text, "multi_modal_data": {}}, params, use_tqdm=False)


def test_chat_uses_the_template_and_answers(llm, hf):
    conv = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    out = llm.chat(conv, SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)[0]
    ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(conv), add_special_tokens=False)
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == hf_greedy_ids(hf, ids, 16, eos=2)
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"  # ended on <|im_end|>, which is not in the text


def test_async_client_streams_and_cancellation_frees_blocks(llm):
    engine = ThreadEngineClient(llm.core)

    async def main():
        text, final = "", None
        async for out in engine.generate("Once upon a time", SamplingParams(max_tokens=12, temperature=0,
                                                                          ignore_eos=True)):
            text += out.outputs[0].delta_text
            final = out
        assert final.finished and text == final.outputs[0].text and len(final.outputs[0].token_ids) == 12

        async def consume_two():
            n = 0
            async for _ in engine.generate("Tell me a long story", SamplingParams(max_tokens=500, ignore_eos=True)):
                n += 1
                if n == 2:
                    await asyncio.sleep(3600)  # a client that stops reading; cancelled below

        task = asyncio.create_task(consume_two())
        await asyncio.sleep(1.0)
        assert llm.core.stats()["kv_used_blocks"] > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            await asyncio.sleep(0.05)
            if llm.core.stats()["kv_used_blocks"] == 0 and not llm.core.has_unfinished():
                break
        assert llm.core.stats()["kv_used_blocks"] == 0

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_chat_passes_tools_and_template_kwargs_and_structured_outputs_constrain(llm):
    """LLM.chat renders tools and chat_template_kwargs as transformers' apply_chat_template does (same template,
    same messages); SamplingParams.structured_outputs constrains the offline answer (validated by jsonschema)."""
    import json

    import jsonschema
    from transformers import PreTrainedTokenizerFast

    template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
                "{% if mood %}MOOD:{{ mood }}\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    conv = [{"role": "user", "content": "Describe a city as JSON."}]
    saved, llm.tokenizer.chat_template = llm.tokenizer.chat_template, template
    try:
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                   "population": {"type": "integer", "minimum": 0}},
                  "required": ["city", "population"], "additionalProperties": False}
        out = llm.chat(conv, SamplingParams(max_tokens=60, temperature=0, structured_outputs={"json": schema}),
                       use_tqdm=False, tools=tools, chat_template_kwargs={"mood": "calm"})[0]
    finally:
        llm.tokenizer.chat_template = saved
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=llm.tokenizer.backend)
    ref = hf_tok.apply_chat_template(conv, tools=tools, chat_template=template, tokenize=False, mood="calm")
    assert ref.startswith("TOOLS:get_time;MOOD:calm\n")  # trim_blocks eats the newline after endfor
    assert out.prompt_token_ids == llm.tokenizer.encode(ref, add_special_tokens=False)
    jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_a_consumer_that_lags_holds_one_merged_output(llm):
    """A stream whose consumer does not read while the request runs keeps one output (the steps' deltas merged),
    not one per step: memory bounded whatever the answer's length. Reading it then gives the same answer."""
    engine = ThreadEngineClient(llm.core)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=1)

    async def main():
        eager = []
        async for out in engine.generate("Once upon a time", params):
            eager.append(out)
        stream = engine.submit("Once upon a time", params)
        for _ in range(400):  # let it finish unread (submit returns before the core has it: watch the stream)
            await asyncio.sleep(0.05)
            if stream.state.finished:
                break
        await asyncio.sleep(0.2)
        assert stream.state.pending  # the unread steps' news, applied to the request's state
        lagged = [out async for out in stream]
        return eager, lagged

    try:
        eager, lagged = asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(eager) > 10 and len(lagged) == 1
    final, merged = eager[-1].outputs[0], lagged[0].outputs[0]
    assert lagged[0].finished and merged.finish_reason == final.finish_reason == "length"
    assert merged.delta_text == merged.text == final.text and merged.delta_token_ids == final.token_ids
    assert [lp.token_id for lp in merged.delta_logprobs] == final.token_ids


def test_a_refused_request_ends_its_stream_and_leaves_the_others_running(llm):
    """submit() returns at once (no acknowledgement round trip); what only the core can refuse (a full queue)
    ends that stream with the core's error before any output, and a second request under an id in use is refused
    without touching the first, which finishes as if alone."""
    from rtp_llm.errors import QueueFullError, RequestRejected

    engine = ThreadEngineClient(llm.core)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    saved = llm.core.config.max_queue_len

    async def main():
        first = engine.submit("Once upon a time", params, request_id="same")
        with pytest.raises(RequestRejected, match="already in use"):
            engine.submit("Another", params, request_id="same")
        outs = [out async for out in first]
        llm.core.config.max_queue_len = 0  # the core refuses what reaches it now
        refused = engine.submit("Once upon a time", params)
        with pytest.raises(QueueFullError):
            await refused.wait_started()
        return outs

    try:
        outs = asyncio.run(main())
    finally:
        llm.core.config.max_queue_len = saved
        engine.shutdown()
    alone = llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0]
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == alone.token_ids
    assert llm.core.stats()["kv_used_blocks"] == 0 and not llm.core.has_unfinished()
