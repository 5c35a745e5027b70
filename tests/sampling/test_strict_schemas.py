"""Strict JSON schemas (the default): an object that names its properties takes no other unless the schema says so,
checked on llguidance's own matcher over the embedded model's real tokenizer, and the schema rewrite itself."""

import pytest

from rtp_llm.models.default_model import default_model_path
from rtp_llm.sampling.grammar import GrammarCompiler
from rtp_llm.sampling.structured_outputs import StructuredOutputs, strict_schema
from rtp_llm.tokenizer.tokenizer import Tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def compiler():
    tok = Tokenizer.load(default_model_path())
    return tok, GrammarCompiler(tok, tok.vocab_size)


def takes(compiler, schema, text, strict=True) -> bool:
    tok, gc = compiler
    grammar = gc.matcher(StructuredOutputs(json=schema, strict=strict))
    ids = tok.encode(text, add_special_tokens=False)
    return all(grammar.accept(t, ids[:i + 1]) is None for i, t in enumerate(ids)) and grammar.matcher.is_accepting()


@pytest.mark.parametrize("schema,text,strict,lenient", [
    (CITY, '{"city": "Paris"}', True, True),
    (CITY, '{"city": "Paris", "description": "x"}', False, True),
    ({**CITY, "additionalProperties": True}, '{"city": "Paris", "n": 1}', True, True),
    ({**CITY, "additionalProperties": {"type": "integer"}}, '{"city": "Paris", "n": 1}', True, True),
    ({"type": "object", "properties": {"a": CITY}}, '{"a": {"city": "P", "x": 1}}', False, True),
    ({"type": "array", "items": CITY}, '[{"city": "P", "x": 1}]', False, True),
    ({"anyOf": [CITY, {"type": "integer"}]}, '{"city": "P", "x": 1}', False, True),
    ({"type": "object"}, '{"x": 1}', True, True),  # names no properties: any object, strict or not
])
def test_unnamed_properties_only_where_the_schema_allows(compiler, schema, text, strict, lenient):
    assert takes(compiler, schema, text) is strict
    assert takes(compiler, schema, text, strict=False) is lenient


def test_all_of_members_stay_open_so_they_compose():
    both = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                      {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {}}}}}]}
    out = strict_schema(both)
    assert all("additionalProperties" not in m for m in out["allOf"])
    assert out["allOf"][1]["properties"]["b"]["additionalProperties"] is False  # nested objects still closed
    assert strict_schema({"$defs": {"P": CITY}, "$ref": "#/$defs/P"})["$defs"]["P"]["additionalProperties"] is False
