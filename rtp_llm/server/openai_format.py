"""Engine outputs -> OpenAI / RTP-LLM response bodies."""

from __future__ import annotations

import time
from typing import Iterable, Optional

from rtp_llm.engine.outputs import CompletionOutput, RequestOutput


def _token_text(srv, token_id: int) -> str:
    return srv.tokenizer.decode([token_id], skip_special_tokens=False)


def _chat_logprobs(srv, lps) -> Optional[dict]:
    if lps is None:
        return None
    content = []
    for lp in lps:
        tok = _token_text(srv, lp.token_id)
        content.append({"token": tok, "logprob": lp.logprob, "bytes": list(tok.encode("utf-8")),
                        "top_logprobs": [{"token": (t := _token_text(srv, i)), "logprob": v,
                                          "bytes": list(t.encode("utf-8"))} for i, v in lp.top]})
    return {"content": content}


def _completion_logprobs(srv, lps, text_start: int = 0) -> Optional[dict]:
    if lps is None:
        return None
    tokens, offsets, pos = [], [], text_start
    for lp in lps:
        t = _token_text(srv, lp.token_id)
        tokens.append(t)
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{_token_text(srv, i): v for i, v in lp.top} for lp in lps], "text_offset": offsets}


def sum_usage(outs: Iterable[RequestOutput]) -> dict:
    total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for o in outs:
        for k, v in o.usage.items():
            total[k] += v
    return total


def chat_response(srv, out: RequestOutput, rid: str, created: int, make_parser) -> dict:
    choices = []
    for o in out.outputs:
        parser = make_parser()
        parser.feed(o.text, final=True)
        choices.append({"index": o.index, "message": parser.message(), "logprobs": _chat_logprobs(srv, o.logprobs),
                        "finish_reason": parser.finish_reason(o.finish_reason)})
    return {"id": rid, "object": "chat.completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": choices, "usage": out.usage}


def chat_chunks(srv, rid: str, created: int, o: CompletionOutput, parser, first: bool) -> list[dict]:
    """This step's chunks of one choice: its new reasoning / content / tool-call deltas (the role on the very
    first), the step's logprobs on the first chunk, the finish reason on the last."""
    deltas = []
    for event in parser.feed(o.delta_text, final=o.finish_reason is not None):
        deltas.extend(parser.delta(event))
    finish = parser.finish_reason(o.finish_reason)
    if not deltas and (finish or o.delta_logprobs):
        deltas = [{}]
    chunks = [{"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
               "system_fingerprint": None,
               "choices": [{"index": o.index, "delta": d,
                            "logprobs": _chat_logprobs(srv, o.delta_logprobs) if i == 0 else None,
                            "finish_reason": finish if i == len(deltas) - 1 else None}]}
              for i, d in enumerate(deltas)]
    if first:  # OpenAI's first chunk: the role alone, then the deltas
        chunks.insert(0, {"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
                          "system_fingerprint": None,
                          "choices": [{"index": o.index, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}]})
    return chunks


def completion_response(srv, outs: list[RequestOutput], rid: str, created: int, req, prompts) -> dict:
    choices = []
    for i, out in enumerate(outs):
        prefix = ""
        if req.echo:
            p = prompts[i]
            prefix = p if isinstance(p, str) else srv.tokenizer.decode(p, skip_special_tokens=False)
        for o in out.outputs:
            choices.append({"index": i * req.n + o.index, "text": prefix + o.text,
                            "logprobs": _completion_logprobs(srv, o.logprobs, len(prefix)),
                            "finish_reason": o.finish_reason})
    return {"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": choices, "usage": sum_usage(outs)}


def completion_chunk(srv, rid: str, created: int, index: int, o: CompletionOutput) -> Optional[dict]:
    if not (o.delta_text or o.finish_reason):
        return None
    return {"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
            "system_fingerprint": None, "choices": [{"index": index, "text": o.delta_text, "logprobs": _completion_logprobs(srv, o.delta_logprobs),
                         "finish_reason": o.finish_reason}]}


def native_response(out: RequestOutput, t0: float, incremental: bool) -> dict:
    texts = [o.delta_text if incremental else o.text for o in out.outputs]
    return {
        "response": texts[0] if len(texts) == 1 else texts,
        "finished": out.finished,
        "aux_info": {
            "input_len": len(out.prompt_token_ids),
            "output_len": max(len(o.token_ids) for o in out.outputs),
            "reuse_len": out.num_cached_tokens,
            "cost_time": round((time.monotonic() - t0) * 1000, 3),
            "finish_reason": [o.finish_reason for o in out.outputs] if len(texts) > 1 else out.outputs[0].finish_reason,
        },
    }
