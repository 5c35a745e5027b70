"""StructuredOutputs: what a request's output must match (vLLM's StructuredOutputsParams): a JSON schema, any JSON
object, a regular expression, one of a list of strings, or a grammar (Lark, or GBNF as llama.cpp writes it).
Exactly one is given. sampling/grammar.py turns it into a token mask per step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputs:
    json: Optional[Union[str, dict]] = None      # a JSON schema (dict or its text)
    json_object: bool = False                    # any JSON object
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None                # Lark (llguidance's dialect) or GBNF
    # JSON without optional whitespace: ", " and ": " only (vLLM's disable_any_whitespace).
    disable_any_whitespace: bool = False
    # A JSON schema's objects that name their properties take no others unless the schema says so (OpenAI's strict
    # mode, vLLM's default xgrammar backend); false = JSON Schema's reading (unnamed properties allowed).
    strict: bool = True
    # The constraint starts after these tokens appear in the output (the end of a reasoning part, e.g. </think>);
    # empty = from the first token.
    after_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs takes exactly one of {', '.join(KINDS)}, got "
                             f"{', '.join(given) or 'none'}")
        if self.disable_any_whitespace and self.kind not in ("json", "json_object"):
            raise ValueError(f"structured_outputs.disable_any_whitespace applies to json and json_object, not "
                             f"{self.kind}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of non-empty strings")
        self.after_token_ids = tuple(int(t) for t in self.after_token_ids)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple:
        """Equal for requests that compile to the same grammar (the compiled-grammar cache key)."""
        value: Any = getattr(self, self.kind)
        if self.kind == "json" and not isinstance(value, str):
            value = json.dumps(value, sort_keys=True)
        elif self.kind == "choice":
            value = tuple(value)
        return self.kind, value, self.disable_any_whitespace, self.strict and self.kind == "json"


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def strict_schema(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that names its properties and says nothing of
    others. allOf's members are left open: each would forbid the others' properties."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and not any(k in out for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: strict_schema(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(v) for v in out[key]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    if isinstance(out.get("allOf"), list):  # inside a member, its own nested objects are still closed
        out["allOf"] = [{**m, **{k: v for k, v in strict_schema(m).items() if k != "additionalProperties"}}
                        if isinstance(m, dict) else m for m in out["allOf"]]
    return out
