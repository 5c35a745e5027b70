"""The typed messages between an EngineClient and the EngineCore it drives (engine/core_loop.py carries them,
in a thread or over a pipe to the engine process), and the EngineRequest the input processor makes.

client -> core:  AddRequest | AbortRequest | UnloadLoRA | Shutdown
core -> client:  Ready | StartupFailed                once, at start-up
                 Rejected                             an AddRequest the core refused (queue full, id in use);
                                                      an accepted one gets no answer but its outputs
                 StepOutputs | StatsUpdate            after a step / after commands that changed the state
                 WorkerFailed                         a tensor-parallel worker died or hung (monitor thread)
                 CoreDied                             the engine loop raised
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from rtp_llm.engine.outputs import TokenLogprob
from rtp_llm.lora.adapter import LoRARequest
from rtp_llm.pooling.params import PoolingParams
from rtp_llm.sampling.params import SamplingParams


@dataclass(frozen=True)
class InputLimits:
    """What a request is checked against, as the engine core answers it (EngineCore.limits; the engine process
    sends it in its Ready message)."""
    max_model_len: int
    vocab_size: int        # the model's (its embedding rows), which may exceed the tokenizer's
    kv_blocks: int         # usable KV blocks: a request whose worst case needs more could never run
    block_size: int
    max_logprobs: int = 20  # the most top logprobs a request may ask (-1: no cap)
    tasks: tuple[str, ...] = ("generate",)  # what the runner answers: generate, or pooling's embed / score / classify
    hidden_size: int = 0    # the largest embedding a pooling request may ask (dimensions)
    labels: tuple[str, ...] = ()  # a classifier's label names (/classify)


@dataclass
class EngineRequest:
    """A validated request: token ids within the vocabulary and max_model_len, its sampling parameters."""
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    pooling: Optional[PoolingParams] = None  # a pooling request (--runner pooling): its prompt only, no tokens
    lora: Optional[LoRARequest] = None       # the adapter it runs with (--enable_lora); None: the base model


# --- client -> core ---------------------------------------------------------------------------------------
@dataclass
class AddRequest:
    request: EngineRequest


@dataclass
class AbortRequest:
    request_id: str


@dataclass
class UnloadLoRA:
    """Forget a LoRA adapter once no request uses it (the server no longer routes requests to it)."""
    name: str


@dataclass
class Shutdown:
    pass


# --- core -> client ---------------------------------------------------------------------------------------
@dataclass
class SampleDelta:
    """One sample's news of a step."""
    index: int
    text: str
    token_ids: list[int]
    logprobs: Optional[list[TokenLogprob]]  # None: not asked
    finish_reason: Optional[str]
    stop_reason: Optional[object]


@dataclass
class OutputDelta:
    """One request's news of a step; a RequestState (engine/outputs.py) turns these into RequestOutputs."""
    request_id: str
    prompt_token_ids: Optional[list[int]]  # with the request's first delta only
    finished: bool
    num_cached_tokens: int
    error: Optional[str]
    metrics: dict
    samples: list[SampleDelta]
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None  # once, when complete (first token sampled)
    pooled: Optional[list[float]] = None  # a pooling request's result, with its last delta


@dataclass
class Ready:
    model_path: str
    limits: InputLimits
    stats: dict


@dataclass
class StartupFailed:
    error: BaseException


@dataclass
class Rejected:
    request_id: str
    error: BaseException


@dataclass
class StepOutputs:
    outputs: list[OutputDelta]
    stats: dict


@dataclass
class StatsUpdate:
    stats: dict


@dataclass
class WorkerFailed:
    message: str


@dataclass
class CoreDied:
    error: BaseException
