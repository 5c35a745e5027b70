"""Chat templates rendered with Jinja2 in the environment Hugging Face templates are written for:
sandboxed, trim_blocks + lstrip_blocks, loop controls, `raise_exception`, `tojson`, `strftime_now`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from rtp_llm.errors import ChatTemplateError


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **variables) -> str:
    import jinja2

    try:
        return _compile(source).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # e.g. '+' on a None
        raise ChatTemplateError(f"chat template failed on these messages: {type(exc).__name__}: {exc}") from exc
