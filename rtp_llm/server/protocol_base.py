"""The base of every request body (protocol.py, protocol_native.py): unknown fields refused by name (or ignored with
--unknown_fields ignore), an explicit null read as the field's default, every string checked for text no tokenizer
can take, rules between fields located for the error's param; and the OpenAI error body."""

from __future__ import annotations

import logging
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger("rtp_llm.server")


class UnknownFields:
    """What a field no model names does: a 400 naming it (OpenAI's own behaviour, the default), or with
    --unknown_fields ignore (vLLM's reading, for clients that add vendor fields) a warning once per field."""
    ignore = False
    _warned: set = set()

    @classmethod
    def strip(cls, model: type, data: dict) -> dict:
        known = _names(model)
        extra = [k for k in data if k not in known]
        for k in extra:
            if (model.__name__, k) not in cls._warned:
                cls._warned.add((model.__name__, k))
                log.warning("ignoring the unknown request field %r of %s (--unknown_fields ignore)", k,
                            model.__name__)
        return {k: v for k, v in data.items() if k in known}


def _names(model: type) -> dict:
    """A model's field spellings (name and alias) -> whether null there means the field's default."""
    cached = model.__dict__.get("_spellings")
    if cached is None:
        cached = {}
        for name, f in model.model_fields.items():
            default_on_null = not f.is_required() and f.get_default(call_default_factory=True) is not None
            spellings = {name, f.alias} | set(getattr(f.validation_alias, "choices", None) or [f.validation_alias])
            for spelling in spellings - {None}:
                if isinstance(spelling, str):
                    cached[spelling] = default_on_null
        model._spellings = cached
    return cached


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_and_unknowns(cls, data):
        """An explicit null on an optional field means its default (the openai SDK sends null for a None
        argument; OpenAI and vLLM read it so)."""
        if not isinstance(data, dict):
            return data
        names = _names(cls)
        data = {k: v for k, v in data.items() if not (v is None and names.get(k))}
        return UnknownFields.strip(cls, data) if UnknownFields.ignore else data


class BadText(ValueError):
    """A string of the request that is not valid Unicode text (a lone surrogate such as \\udcff: valid JSON, but
    no UTF-8 spelling, so no tokenizer or template can take it). `path`: the field, as the error's param."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


class FieldRule(ValueError):
    """A rule between fields broken (checked on the whole object, so pydantic locates it no deeper): `param` is
    the field the client should change, relative to that object, reported as the error's param."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _check_text(value, path: str = "") -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start]
            raise BadText(path, f"{path or 'body'}: not valid Unicode text (lone surrogate U+{ord(bad):04X} at "
                                f"character {exc.start})") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, path)
            _check_text(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, f"{path}.{i}" if path else str(i))


class ApiRequest(ApiModel):
    """A whole request body: every string in it, at any depth, is checked for text no tokenizer can take."""

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data):
        _check_text(data)
        return data


def error_body(message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
               code: Any = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
