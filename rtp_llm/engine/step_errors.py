"""What a failed step tells its requests: which requests, which layer and which operator, a one-line cause in the
user's terms where the failure is a known one, then the device's own message (CANN's, CUDA's, the CPU kernel's). Read
off the exception's traceback when a step fails, so a step that succeeds pays nothing."""

from __future__ import annotations

import linecache
import logging
import os
import re
from typing import Optional

log = logging.getLogger("rtp_llm.engine.core")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # rtp_llm/
# the call on a source line: torch_npu.npu_x(, self.torch_npu.npu_x(, self.kernels.x(, attn.forward(, F.linear(
_CALL = re.compile(r"((?:torch_npu|kernels|ops|attn|F|torch)\.[A-Za-z_][\w.]*)\s*\(")
# Failures whose device message is cryptic, in the user's terms (the device's message follows anyway).
_KNOWN = [
    (re.compile(r"inputDataType should be bf16"), "fused attention: the query is not bfloat16 with TND layout; CANN "
                                                  "accepts bfloat16 only (run --dtype bfloat16)"),
    (re.compile(r"queryD, keyD and valueD must be the same and equal 128/64|head dim"),
     "fused attention: a head dim the TND layout does not take (64 or 128)"),
    (re.compile(r"block_size .*multiple of 128|block_size .*must be"), "fused attention: a KV block size the kernel "
                                                                      "does not take (--block_size 128)"),
    (re.compile(r"out of memory|Cannot allocate memory|can't allocate memory", re.I),
     "the device ran out of memory (lower --max_num_batched_tokens or the KV cache size)"),
]


def _frames(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def locate(exc: BaseException) -> tuple[Optional[int], Optional[str]]:
    """(decoder layer index, operator) of the deepest frames of rtp_llm's own code in the traceback."""
    layer, operator = None, None
    for frame, lineno in _frames(exc):
        code = frame.f_code
        if not code.co_filename.startswith(_ROOT):
            continue
        if code.co_name == "forward" and type(frame.f_locals.get("self")).__name__ == "DecoderLayer":
            layer = getattr(frame.f_locals["self"], "index", None)
        m = _CALL.search(linecache.getline(code.co_filename, lineno))
        if m:
            operator = m.group(1).split(".")[-1] if m.group(1).startswith(("torch_npu", "kernels")) else m.group(1)
    return layer, operator


def describe(exc: BaseException, request_ids) -> str:
    """One message for the requests of a failed step."""
    layer, operator = locate(exc)
    where = []
    if layer is not None:
        where.append(f"layer {layer}")
    if operator is not None:
        where.append(f"operator {operator}")
    device_msg = " ".join(str(exc).split()) or type(exc).__name__
    cause = next((text for pattern, text in _KNOWN if pattern.search(device_msg)), None)
    ids = ", ".join(sorted(str(r) for r in request_ids))
    parts = [f"step of request{'s' if ',' in ids else ''} {ids} failed" + (f" in {', '.join(where)}" if where else "")]
    if cause:
        parts.append(cause)
    parts.append(f"device: {type(exc).__name__}: {device_msg[:600]}")
    return "; ".join(parts)


def fail_step(core, sched, exc: Exception) -> list:
    """A failed step (EngineCore.step): each of its requests runs alone (Scheduler.subset), drafts and all: the ones
    that pass go on (a request's own input made the step fail, not theirs), the ones that fail again end with the
    layered error. With tensor parallelism on (the workers may have stopped inside a collective), or a step of one
    request, every request of the step ends with it."""
    from rtp_llm.engine.sequence import FinishReason
    from rtp_llm.errors import TPWorkerError

    by_request: dict = {}
    for x in sched.scheduled:
        by_request.setdefault(x.seq.request, []).append(x)
    log.error("%s", describe(exc, [r.request_id for r in by_request]), exc_info=exc)
    if len(by_request) == 1 or core.tp_runtime is not None:
        for req in by_request:
            if req.request_id in core.requests:
                core.abort(req.request_id, FinishReason.ERROR, describe(exc, [req.request_id]))
        return []
    outputs = []
    for req, items in by_request.items():
        if req.request_id not in core.requests:
            continue
        sub = core.scheduler.subset(sched, items)
        try:
            result = core.runner.execute(sub)
        except TPWorkerError:
            raise
        except Exception as alone:
            core.abort(req.request_id, FinishReason.ERROR, describe(alone, [req.request_id]))
            continue
        outputs.extend(core.update_from_output(sub, result))
    return outputs
