"""InputProcessor: requests as callers give them -> EngineRequests the core runs. Chat messages are rendered
through the model's template, text is tokenized, and every request is checked against the model's limits (empty
prompt, ids outside the vocabulary, prompt + max_tokens over max_model_len), so a bad request is refused with a
message naming the problem before it reaches the engine loop. It runs where the caller runs (the server process,
the offline LLM's thread), never on the engine's step.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence, Union

from rtp_llm.engine.protocol import EngineRequest, InputLimits
from rtp_llm.errors import RequestRejected
from rtp_llm.lora.adapter import LoRARequest
from rtp_llm.pooling.params import PoolingParams
from rtp_llm.sampling.grammar import GrammarCompiler
from rtp_llm.sampling.params import SamplingParams

# A text, token ids, or vLLM's TextPrompt / TokensPrompt dicts: {"prompt": text} / {"prompt_token_ids": ids}.
Prompt = Union[str, Sequence[int], dict]


class InputProcessor:
    def __init__(self, tokenizer, limits: InputLimits, grammars: Optional[GrammarCompiler] = None):
        """grammars: the engine's compiler when it runs in this process (its cache is then shared)."""
        self.tokenizer = tokenizer
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.vocab_size = limits.vocab_size
        self.max_logprobs = limits.max_logprobs
        self.grammars = grammars or GrammarCompiler(tokenizer, limits.vocab_size)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: Optional[str] = None, **variables) -> str:
        """The conversation through the model's chat template, or chat_template (ChatTemplateError if the template
        refuses it); variables: more of the template's context (tools=, a request's chat_template_kwargs such as
        enable_thinking)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  chat_template=chat_template, **variables)

    def chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **variables) -> list[int]:
        # The template writes the special tokens itself.
        return self.tokenizer.encode(self.render_chat(messages, add_generation_prompt, **variables),
                                     add_special_tokens=False)

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, dict):
            keys = set(prompt)
            if keys == {"prompt_token_ids"}:
                return [int(t) for t in prompt["prompt_token_ids"]]
            if keys == {"prompt"} and isinstance(prompt["prompt"], str):
                return self.tokenizer.encode(prompt["prompt"])
            raise RequestRejected(f"a prompt dict takes 'prompt' (text) or 'prompt_token_ids' alone, got keys "
                                  f"{sorted(keys)}")
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]

    def bad_words_ids(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's tokens as it would appear first in a text and after a space (vLLM's two spellings)."""
        out: list[list[int]] = []
        for word in words:
            if not word.strip():  # would ban a whitespace token, not a word
                raise RequestRejected(f"bad_words: {word!r} is not a word (empty or only whitespace)",
                                      param="bad_words")
            for text in (word, " " + word.lstrip(" ")):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in out:
                    out.append(ids)
        return out

    def process(self, request_id: str, prompt: Prompt, params: Optional[SamplingParams] = None,
                arrival: Optional[float] = None, pooling: Optional[PoolingParams] = None,
                lora: Optional[LoRARequest] = None) -> EngineRequest:
        """pooling: a pooling request (embed / score / classify), which reads its prompt and generates nothing;
        lora: the adapter to run with (the engine loads it, or refuses it, when the request arrives)."""
        ids = self.encode(prompt)
        if not ids:
            raise RequestRejected("the prompt is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestRejected(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        task = "generate" if pooling is None else pooling.task
        if task not in self.limits.tasks:
            if task == "generate":
                why = "it runs --runner pooling"
            elif "generate" in self.limits.tasks:
                why = "start it with --runner pooling"
            elif task == "embed":
                why = "embeddings need a base or causal model"
            else:
                why = "scores need a cross-encoder (*ForSequenceClassification) or classifier_from_token"
            raise RequestRejected(f"this engine answers {', '.join(self.limits.tasks)}, not {task} ({why})",
                                  param="model")
        if pooling is not None:
            return self._pooling(request_id, ids, pooling, arrival)
        params = params or SamplingParams()
        if params.bad_words and not params.bad_words_token_ids:
            params.bad_words_token_ids = self.bad_words_ids(params.bad_words)
        for name, named in params.token_id_fields().items():
            bad = [t for t in named if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise RequestRejected(f"{name}: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                                      param=name)
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is None:
                continue
            count = self.vocab_size if asked == -1 else asked
            if count > self.vocab_size:  # never clamped: the answer would hold fewer than asked
                raise RequestRejected(f"{name}: {asked} exceeds the vocabulary ({self.vocab_size} tokens); -1 asks "
                                      f"for all of it", param=name)
            if self.max_logprobs != -1 and count > self.max_logprobs:
                what = "-1 (the whole vocabulary)" if asked == -1 else str(asked)
                raise RequestRejected(f"{name}: {what} exceeds max_logprobs={self.max_logprobs} (the server's "
                                      f"--max_logprobs; -1 lifts the cap)", param=name)
            setattr(params, name, count)  # -1 resolved: the engine sees a count
        if params.structured_outputs is not None:  # a constraint that cannot compile is refused here, not in a step
            self.grammars.check(params.structured_outputs)
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestRejected(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {len(ids) + params.max_tokens} "
                f"exceeds max_model_len={self.max_model_len}")
        bs, pool = self.limits.block_size, self.limits.kv_blocks
        worst = -(-(len(ids) + params.max_tokens) // bs) + (params.n - 1) * (-(-params.max_tokens // bs) + 1)
        if worst > pool:
            raise RequestRejected(f"the request needs up to {worst} KV blocks but the pool has {pool}; lower "
                                  f"max_tokens or n")
        return EngineRequest(request_id, ids, params, arrival if arrival is not None else time.monotonic(),
                             lora=lora)

    def _pooling(self, request_id: str, ids: list[int], pooling: PoolingParams,
                 arrival: Optional[float]) -> EngineRequest:
        if len(ids) > self.max_model_len:
            raise RequestRejected(f"the input ({len(ids)} tokens) exceeds max_model_len={self.max_model_len}")
        if pooling.dimensions is not None and self.limits.hidden_size and pooling.dimensions > self.limits.hidden_size:
            raise RequestRejected(f"dimensions: {pooling.dimensions} exceeds the model's {self.limits.hidden_size}",
                                  param="dimensions")
        # one sample that reads the prompt: the greedy defaults, never applied
        return EngineRequest(request_id, ids, SamplingParams(max_tokens=1, temperature=0),
                             arrival if arrival is not None else time.monotonic(), pooling)
