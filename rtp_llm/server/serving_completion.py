"""POST /v1/completions: one request per prompt (a list of prompts is a batch), echo with the prompt's logprobs,
streamed as chunks or whole."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import StreamingResponse

from rtp_llm.errors import RequestRejected
from rtp_llm.server import openai_format as fmt
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol import CompletionRequest
from rtp_llm.server.serving import Server
from rtp_llm.server.streams import DONE, sse, usage_flags


async def create_completion(srv: Server, req: CompletionRequest, request: Request):
    lora = srv.check_model(req.model)
    prompts = req.prompts()
    try:
        encoded = [srv.processor.encode(p) for p in prompts]  # checked against the model on submit
    except RequestRejected as exc:
        raise APIError.from_engine(exc) from None
    echo_lps = req.logprobs if req.echo else None  # the prompt's logprobs come first in the answer
    params = [srv.params(req, req.max_tokens, req.logprobs, len(ids), prompt_logprobs=echo_lps) for ids in encoded]
    rid = f"cmpl-{uuid.uuid4().hex}"
    names = {"structured_outputs": req.structured()[1] or "structured_outputs"}
    streams = await srv.submit(request, encoded, params, [f"{rid}-{i}" for i in range(len(encoded))], req.user,
                               names, lora=lora)
    created = int(time.time())
    if req.stream:
        return StreamingResponse(srv.watched(
            _completion_stream(srv, streams, rid, created, req, prompts, [len(x) for x in encoded]), streams),
            media_type="text/event-stream")
    outs = await srv.collect(request, streams)
    return fmt.completion_response(srv, outs, rid, created, req, prompts)


async def _completion_stream(srv: Server, streams, rid, created, req, prompts: list, prompt_lens: list[int]):
    include_usage, continuous = usage_flags(req)
    finals = {}
    produced = [0] * len(streams)
    ended: set[int] = set()  # a choice that finished early reappears, finished, in later outputs: end it once
    announced: set[int] = set()
    async for i, out in srv.outputs(streams):
        produced[i] = out.num_output_tokens
        usage = fmt.running_usage(sum(prompt_lens), sum(produced)) if continuous else None
        for o in out.outputs:
            index = i * req.n + o.index
            if index in ended:
                continue
            if o.finish_reason is not None:
                ended.add(index)
            prompt_ids = None if index in announced else out.prompt_token_ids
            echo = (fmt.echo_text(srv, prompts[i]), out) if req.echo and index not in announced else None
            chunk = fmt.completion_chunk(srv, rid, created, index, o, req, usage, prompt_ids, echo)
            if chunk is not None:
                announced.add(index)
                yield sse(chunk)
        if out.finished:
            finals[i] = out
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
                   "system_fingerprint": None, "choices": [], "usage": fmt.sum_usage(finals.values())})
    yield DONE
