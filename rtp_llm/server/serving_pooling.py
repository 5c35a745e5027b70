"""The pooling routes (--runner pooling): POST /v1/embeddings, /v1/score, /v1/rerank, /classify. Every input is one engine
request; they run in the same scheduler and kernels as generation, many per step, prefill only."""

from __future__ import annotations

import base64
import struct
import time
import uuid

from fastapi import Request

from rtp_llm.errors import RequestRejected
from rtp_llm.pooling import PoolingParams
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol_pooling import ClassifyRequest, EmbeddingRequest, RerankRequest, ScoreRequest
from rtp_llm.server.serving import Server


async def _pool(srv: Server, request: Request, prompts: list, pooling: PoolingParams, rid: str, user) -> list:
    streams = await srv.submit(request, prompts, [None] * len(prompts), [f"{rid}-{i}" for i in range(len(prompts))],
                               user, pooling=pooling)
    return await srv.collect(request, streams)


def _usage(outs) -> dict:
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _prompts(srv: Server, req) -> list[list[int]]:
    try:
        return [srv.tokenizer.encode(x, add_special_tokens=req.add_special_tokens) if isinstance(x, str) else x
                for x in req.inputs()]
    except (ValueError, RequestRejected) as exc:
        raise APIError(400, str(exc), param="input") from None


async def create_embedding(srv: Server, req: EmbeddingRequest, request: Request):
    srv.check_model(req.model)
    try:
        pooling = PoolingParams("embed", req.dimensions, req.normalize)
    except ValueError as exc:
        raise APIError(400, str(exc), param="dimensions") from None
    rid = f"embd-{uuid.uuid4().hex}"
    outs = await _pool(srv, request, _prompts(srv, req), pooling, rid, req.user)
    data = [{"object": "embedding", "index": i,
             "embedding": (base64.b64encode(struct.pack(f"<{len(o.pooled)}f", *o.pooled)).decode()
                           if req.encoding_format == "base64" else o.pooled)} for i, o in enumerate(outs)]
    return {"id": rid, "object": "list", "created": int(time.time()), "model": srv.model_name, "data": data,
            "usage": _usage(outs)}


async def _scores(srv: Server, request: Request, pairs: list[tuple[str, str]], rid: str, user,
                  activation: bool = True) -> tuple[list[float], list]:
    prompts = [srv.tokenizer.encode_pair(a, b) for a, b in pairs]
    outs = await _pool(srv, request, prompts, PoolingParams("score", activation=activation), rid, user)
    return [o.pooled[0] for o in outs], outs


async def create_score(srv: Server, req: ScoreRequest, request: Request):
    srv.check_model(req.model)
    rid = f"score-{uuid.uuid4().hex}"
    scores, outs = await _scores(srv, request, req.pairs(), rid, req.user, req.activation)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": srv.model_name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": _usage(outs)}


async def create_rerank(srv: Server, req: RerankRequest, request: Request):
    srv.check_model(req.model)
    rid = f"rerank-{uuid.uuid4().hex}"
    texts = req.texts()
    scores, outs = await _scores(srv, request, [(req.query, t) for t in texts], rid, req.user)
    order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:req.top_n or len(texts)]
    results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}}
                                                               if req.return_documents else {})} for i in order]
    return {"id": rid, "model": srv.model_name, "usage": {"total_tokens": _usage(outs)["total_tokens"]},
            "results": results}


async def create_classification(srv: Server, req: ClassifyRequest, request: Request):
    srv.check_model(req.model)
    rid = f"classify-{uuid.uuid4().hex}"
    outs = await _pool(srv, request, _prompts(srv, req), PoolingParams("classify", activation=req.activation), rid,
                       req.user)
    labels = srv.processor.limits.labels
    data = []
    for i, o in enumerate(outs):
        best = max(range(len(o.pooled)), key=lambda j: (o.pooled[j], -j))
        data.append({"index": i, "label": labels[best] if best < len(labels) else f"LABEL_{best}", "probs": o.pooled,
                     "num_classes": len(o.pooled)})
    return {"id": rid, "object": "list", "created": int(time.time()), "model": srv.model_name, "data": data,
            "usage": _usage(outs)}
