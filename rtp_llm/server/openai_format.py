"""Engine outputs -> OpenAI / RTP-LLM response bodies.

vLLM's response extras, when the request asks: return_token_ids (prompt ids once, output ids per choice and per
chunk), return_tokens_as_token_ids (logprob tokens spelled "token_id:<id>"), stream_options.continuous_usage_stats
(usage so far on every chunk).
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

from rtp_llm.engine.outputs import CompletionOutput, RequestOutput


def _token_text(srv, token_id: int, as_ids: bool = False) -> str:
    if as_ids:  # vLLM's return_tokens_as_token_ids: tokens that are not whole UTF-8 stay identifiable
        return f"token_id:{token_id}"
    return srv.tokenizer.decode([token_id], skip_special_tokens=False)


def _as_ids(req) -> bool:
    return bool(req is not None and req.return_tokens_as_token_ids)


def _chat_logprobs(srv, lps, as_ids: bool = False) -> Optional[dict]:
    if lps is None:
        return None
    content = []
    for lp in lps:
        tok = _token_text(srv, lp.token_id, as_ids)
        content.append({"token": tok, "logprob": lp.logprob, "bytes": list(tok.encode("utf-8")),
                        "top_logprobs": [{"token": (t := _token_text(srv, i, as_ids)), "logprob": v,
                                          "bytes": list(t.encode("utf-8"))} for i, v in lp.top]})
    return {"content": content}


def _completion_logprobs(srv, lps, text_start: int = 0, as_ids: bool = False) -> Optional[dict]:
    if lps is None:
        return None
    tokens, offsets, pos = [], [], text_start
    for lp in lps:
        t = _token_text(srv, lp.token_id, as_ids)
        tokens.append(t)
        offsets.append(pos)
        pos += len(t)
    tops = []
    for lp, tok in zip(lps, tokens):
        top = {_token_text(srv, i, as_ids): v for i, v in lp.top}
        top.setdefault(tok, lp.logprob)  # OpenAI: the sampled token is always there (up to logprobs + 1 entries)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps], "top_logprobs": tops,
            "text_offset": offsets}


def _top(lp, k: int) -> list:
    return lp.top if k == -1 else lp.top[:k]


def echo_logprobs(srv, out: RequestOutput, k: int, as_ids: bool = False) -> dict:
    """The prompt's part of a completions echo with logprobs (the generated part follows it): as OpenAI's legacy
    API, the first token's logprob and top list are null."""
    tokens = [_token_text(srv, t, as_ids) for t in out.prompt_token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    lps = out.prompt_logprobs or [None] * len(tokens)
    tops = []
    for lp, tok in zip(lps, tokens):
        top = None
        if lp is not None:
            top = {_token_text(srv, i, as_ids): v for i, v in _top(lp, k)}
            top.setdefault(tok, lp.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else lp.logprob for lp in lps],
            "top_logprobs": tops, "text_offset": offsets}


def joined_logprobs(a: dict, b: Optional[dict]) -> dict:
    """Two completions logprobs objects one after the other (an echoed prompt's, then the answer's)."""
    return a if b is None else {key: a[key] + b[key] for key in a}


def prompt_logprobs(srv, out: RequestOutput, k: int, as_ids: bool = False) -> Optional[list]:
    """vLLM's prompt_logprobs: per prompt position null (the first) or {token id: {logprob, rank, decoded_token}}
    with the prompt token itself and the k most likely (-1: all)."""
    if out.prompt_logprobs is None:
        return None
    entries = []
    for lp in out.prompt_logprobs:
        if lp is None:
            entries.append(None)
            continue
        entry = {str(i): {"logprob": v, "rank": r + 1, "decoded_token": _token_text(srv, i, as_ids)}
                 for r, (i, v) in enumerate(_top(lp, k))}
        entry.setdefault(str(lp.token_id), {"logprob": lp.logprob, "rank": lp.rank,
                                            "decoded_token": _token_text(srv, lp.token_id, as_ids)})
        entries.append(entry)
    return entries


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sum_usage(outs: Iterable[RequestOutput]) -> dict:
    total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for o in outs:
        for k, v in o.usage.items():
            total[k] += v
    return total


def chat_response(srv, out: RequestOutput, rid: str, created: int, make_parser, req=None) -> dict:
    choices = []
    for o in out.outputs:
        parser = make_parser()
        parser.feed(o.text, final=True)
        choice = {"index": o.index, "message": parser.message(),
                  "logprobs": _chat_logprobs(srv, o.logprobs, _as_ids(req)),
                  "finish_reason": parser.finish_reason(o.finish_reason)}
        if req is not None and req.return_token_ids:
            choice["token_ids"] = list(o.token_ids)
        choices.append(choice)
    # prompt_logprobs / prompt_token_ids: keys vLLM always returns (null unless asked)
    body = {"id": rid, "object": "chat.completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": choices, "usage": out.usage, "prompt_logprobs": None,
            "prompt_token_ids": None}
    if req is not None and req.return_token_ids:
        body["prompt_token_ids"] = list(out.prompt_token_ids)
    if req is not None and req.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs(srv, out, req.prompt_logprobs, _as_ids(req))
    return body


def chat_chunks(srv, rid: str, created: int, o: CompletionOutput, parser, first: bool, req=None,
                usage: Optional[dict] = None, prompt_ids: Optional[list] = None) -> list[dict]:
    """This step's chunks of one choice: the role alone first (on the choice's very first chunk), then its new
    reasoning / content / tool-call deltas, the step's logprobs on the first of them, the finish reason on the
    last. usage: the running usage (continuous_usage_stats); prompt_ids: sent once (return_token_ids)."""
    deltas = []
    for event in parser.feed(o.delta_text, final=o.finish_reason is not None):
        deltas.extend(parser.delta(event))
    finish = parser.finish_reason(o.finish_reason)
    ids = req is not None and req.return_token_ids
    if not deltas and (finish or o.delta_logprobs or (ids and o.delta_token_ids)):
        deltas = [{}]
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
            "system_fingerprint": None}
    chunks = []
    for i, d in enumerate(deltas):
        choice = {"index": o.index, "delta": d,
                  "logprobs": _chat_logprobs(srv, o.delta_logprobs, _as_ids(req)) if i == 0 else None,
                  "finish_reason": finish if i == len(deltas) - 1 else None}
        if ids:
            choice["token_ids"] = list(o.delta_token_ids) if i == 0 else []
        chunks.append({**head, "choices": [choice]})
    if first:  # OpenAI's first chunk: the role alone, then the deltas
        chunks.insert(0, {**head, "choices": [{"index": o.index, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": None, "finish_reason": None}]})
        if ids and prompt_ids is not None:
            chunks[0]["prompt_token_ids"] = list(prompt_ids)
    if usage is not None:
        for c in chunks:
            c["usage"] = usage
        if first:  # vLLM: the role chunk precedes every token
            chunks[0]["usage"] = running_usage(usage["prompt_tokens"], 0)
    return chunks


def echo_text(srv, prompt) -> str:
    """What completions' echo repeats: the prompt as given, a token-id prompt decoded."""
    return prompt if isinstance(prompt, str) else srv.tokenizer.decode(prompt, skip_special_tokens=False)


def completion_response(srv, outs: list[RequestOutput], rid: str, created: int, req, prompts) -> dict:
    choices = []
    for i, out in enumerate(outs):
        prefix = echo_text(srv, prompts[i]) if req.echo else ""
        for o in out.outputs:
            lps = _completion_logprobs(srv, o.logprobs, len(prefix), _as_ids(req))
            if req.echo and lps is not None:
                lps = joined_logprobs(echo_logprobs(srv, out, req.logprobs, _as_ids(req)), lps)
            choice = {"index": i * req.n + o.index, "text": prefix + o.text, "logprobs": lps,
                      "finish_reason": o.finish_reason, "prompt_logprobs": None, "prompt_token_ids": None}
            if req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs(srv, out, req.prompt_logprobs, _as_ids(req))
            if req.return_token_ids:
                choice.update(prompt_token_ids=list(out.prompt_token_ids), token_ids=list(o.token_ids))
            choices.append(choice)
    return {"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": choices, "usage": sum_usage(outs)}


def completion_chunk(srv, rid: str, created: int, index: int, o: CompletionOutput, req=None,
                     usage: Optional[dict] = None, prompt_ids: Optional[list] = None,
                     echo: Optional[tuple[str, RequestOutput]] = None) -> Optional[dict]:
    """One choice's chunk of a step; echo: on the choice's first chunk with `echo`, the prompt's text and the
    output whose prompt logprobs (with logprobs) come first."""
    ids = req is not None and req.return_token_ids
    if not (o.delta_text or o.finish_reason or echo is not None
            or (ids and (o.delta_token_ids or prompt_ids is not None))):
        return None
    prefix = "" if echo is None else echo[0]
    lps = _completion_logprobs(srv, o.delta_logprobs, len(prefix), as_ids=_as_ids(req))
    if echo is not None and lps is not None:
        lps = joined_logprobs(echo_logprobs(srv, echo[1], req.logprobs, _as_ids(req)), lps)
    choice = {"index": index, "text": prefix + o.delta_text, "logprobs": lps, "finish_reason": o.finish_reason}
    if ids:
        choice["token_ids"] = list(o.delta_token_ids)
        if prompt_ids is not None:
            choice["prompt_token_ids"] = list(prompt_ids)
    body = {"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return body


def native_response(out: RequestOutput, t0: float, incremental: bool) -> dict:
    texts = [o.delta_text if incremental else o.text for o in out.outputs]
    return {
        "response": texts[0] if len(texts) == 1 else texts,
        "finished": out.finished,
        "aux_info": {
            "input_len": len(out.prompt_token_ids),
            "output_len": max(o.num_tokens for o in out.outputs),
            "reuse_len": out.num_cached_tokens,
            "cost_time": round((time.monotonic() - t0) * 1000, 3),
            "finish_reason": [o.finish_reason for o in out.outputs] if len(texts) > 1 else out.outputs[0].finish_reason,
        },
    }
