"""The offline API, as vLLM users know it:

    from rtp_llm import LLM, SamplingParams
    llm = LLM(model="/path/to/model-or.gguf")
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "Hi"}])

The EngineCore runs on the calling thread, step by step, until every prompt has finished.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.engine.core import EngineCore
from rtp_llm.engine.outputs import OutputCollector, RequestOutput
from rtp_llm.sampling import SamplingParams

Prompt = Union[str, Sequence[int]]


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
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Runs every prompt to completion; outputs come back in the order of the prompts."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        requests = [self.processor.process(f"offline-{next(self._ids)}", prompt, p)
                    for prompt, p in zip(prompts, params)]
        ids = [r.request_id for r in requests]
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        collector = OutputCollector()
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Generating", unit="req")
        try:
            for r in requests:
                self.core.add_request(r)
            while len(done) < len(ids):
                for delta in self.core.step():
                    out = collector.add(delta)
                    if out.finished and out.request_id in wanted and out.request_id not in done:
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
