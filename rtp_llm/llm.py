"""The offline API, as vLLM users know it:

    from rtp_llm import LLM, SamplingParams
    llm = LLM(model="/path/to/model-or.gguf")
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "Hi"}])
    vecs = LLM(model=embedding_model, runner="pooling").embed(["a text", "another"])

The EngineCore runs on the calling thread, step by step, until every prompt has finished.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.engine.core import EngineCore
from rtp_llm.engine.outputs import OutputCollector, RequestOutput
from rtp_llm.lora import LoRARequest
from rtp_llm.pooling import PoolingParams
from rtp_llm.sampling import SamplingParams

Prompt = Union[str, Sequence[int]]


def _many(prompts) -> list:
    if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class LLM:
    def __init__(self, model: Optional[str] = None, **engine_args: Any):
        self.core = EngineCore(EngineConfig(model=model, **engine_args))
        self.tokenizer = self.core.tokenizer
        self.processor = self.core.input_processor()
        self._ids = itertools.count()

    def close(self) -> None:
        """Stops tensor-parallel workers (LLM(..., tp_size=N)); also done on leaving a `with` block."""
        self.core.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None) -> list[RequestOutput]:
        """Runs every prompt to completion; outputs come back in the order of the prompts. lora_request: one
        adapter for all (LLM(..., enable_lora=True)), or one per prompt (None: the base model)."""
        prompts = _many(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        loras = lora_request if isinstance(lora_request, (list, tuple)) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(loras)} lora requests")
        return self._run([self.processor.process(f"offline-{next(self._ids)}", prompt, p, lora=lora)
                          for prompt, p, lora in zip(prompts, params, loras)], use_tqdm, "Generating")

    def embed(self, prompts: Union[Prompt, Sequence[Prompt]], pooling_params: Optional[PoolingParams] = None,
              use_tqdm: bool = True) -> list[list[float]]:
        """Each prompt's embedding (LLM(..., runner="pooling") on an embedding model), in the order of the prompts."""
        pooling = pooling_params or PoolingParams("embed")
        return [o.pooled for o in self._run([self.processor.process(f"offline-{next(self._ids)}", p, pooling=pooling)
                                             for p in _many(prompts)], use_tqdm, "Embedding")]

    def classify(self, prompts: Union[Prompt, Sequence[Prompt]], use_tqdm: bool = True) -> list[list[float]]:
        """vLLM's LLM.classify on a *ForSequenceClassification model: each prompt's label probabilities (the names:
        the checkpoint's id2label, core.model_config.labels), in the order of the prompts."""
        pooling = PoolingParams("classify")
        return [o.pooled for o in self._run([self.processor.process(f"offline-{next(self._ids)}", p, pooling=pooling)
                                             for p in _many(prompts)], use_tqdm, "Classifying")]

    def score(self, first: Union[str, Sequence[str]], second: Union[str, Sequence[str]],
              pooling_params: Optional[PoolingParams] = None, use_tqdm: bool = True) -> list[float]:
        """vLLM's LLM.score on a cross-encoder or reranker: one text against each of a list, or pairs one to one."""
        first, second = ([first] if isinstance(first, str) else list(first)), (
            [second] if isinstance(second, str) else list(second))
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise ValueError(f"score pairs texts one to one: {len(first)} first texts, {len(second)} second texts")
        pooling = pooling_params or PoolingParams("score")
        requests = [self.processor.process(f"offline-{next(self._ids)}", self.tokenizer.encode_pair(a, b),
                                           pooling=pooling) for a, b in zip(first, second)]
        return [o.pooled[0] for o in self._run(requests, use_tqdm, "Scoring")]

    def _run(self, requests: list, use_tqdm: bool, what: str) -> list[RequestOutput]:
        ids = [r.request_id for r in requests]
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        collector = OutputCollector()
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc=what, unit="req")
        try:
            for r in requests:
                self.core.add_request(r)
            while len(done) < len(ids):
                deltas = self.core.step()
                if self.core.rejected:  # refused after add_request (an adapter that failed to load)
                    raise self.core.rejected.pop(0)[1]
                for delta in deltas:
                    out = collector.add(delta)
                    if out.finished and out.request_id in wanted and out.request_id not in done:
                        if out.error is not None and out.pooled is None and requests[0].pooling is not None:
                            raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                        done[out.request_id] = out
                        if bar:
                            bar.update(1)
        finally:
            if bar:
                bar.close()
            for rid in ids:
                if rid not in done:
                    self.core.abort(rid)
        return [done[r] for r in ids]

    def chat(self, messages: Union[list[dict], Sequence[list[dict]]], params: Optional[SamplingParams] = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True, tools: Optional[list[dict]] = None,
             chat_template_kwargs: Optional[dict] = None) -> list[RequestOutput]:
        """One conversation (a list of messages) or several, through the model's chat template; tools (OpenAI's
        form) and chat_template_kwargs go to the template as vLLM's LLM.chat passes them. The answers are text:
        the server parses tool calls and reasoning (--tool_call_parser, --reasoning_parser)."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        variables = dict(chat_template_kwargs or {})
        if tools:
            variables["tools"] = tools
        return self.generate([self.processor.chat_prompt(c, add_generation_prompt, **variables) for c in convs],
                             params, use_tqdm)
