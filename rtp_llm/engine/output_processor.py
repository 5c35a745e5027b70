"""OutputProcessor: from sampled tokens to what callers see. Each token is appended to its sequence and
detokenized (stop strings need the text, so this runs in the core, right after the step); stop tokens, stop
strings, max_tokens and max_model_len end a sample; each touched request gets one OutputDelta per step with its
new text, tokens and logprobs.

min_tokens holds back every stop: stop token ids are banned from sampling until then (ModelRunner), and stop
strings are not matched in the text of the first min_tokens tokens.
"""

from __future__ import annotations

import time
from typing import Optional

from rtp_llm.engine.outputs import TokenLogprob
from rtp_llm.engine.protocol import OutputDelta, SampleDelta
from rtp_llm.engine.sequence import FinishReason, Request, Sequence


class StepDelta:
    """One sequence's news within a step."""
    __slots__ = ("text", "token_ids", "logprobs")

    def __init__(self):
        self.text, self.token_ids, self.logprobs = "", [], []


class OutputProcessor:
    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len

    def append(self, seq: Sequence, token: int, logprob: Optional[TokenLogprob],
               delta: StepDelta) -> Optional[tuple[FinishReason, object]]:
        """Adds a sampled token; returns (finish reason, stop reason) when it ends the sample."""
        req, params = seq.request, seq.request.params
        seq.output.append(token)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        if logprob is not None:
            seq.logprobs.append(logprob)
            delta.logprobs.append(logprob)
        delta.token_ids.append(token)
        n_out = len(seq.output)
        grammar_done = False
        if seq.grammar is not None:
            problem = seq.grammar.accept(token, seq.output)
            if problem is not None:
                raise ValueError(f"structured output: {problem}")
            grammar_done = seq.grammar.done
        if token in req.stop_ids and n_out > params.min_tokens:
            return FinishReason.STOP, token
        detok = seq.detok
        if n_out <= params.min_tokens and detok.stop:
            saved, detok.stop = detok.stop, []  # min_tokens: no stop strings yet
            text = detok.add(token)
            detok.stop = saved
        else:
            text = detok.add(token)
        if detok.stopped_by is not None:
            delta.text += text
            return FinishReason.STOP, detok.stopped_by
        if grammar_done:  # the output is complete: what the grammar allows now is EOS alone
            delta.text += text + detok.flush()
            return FinishReason.STOP, None
        if n_out >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            delta.text += text + detok.flush()
            return FinishReason.LENGTH, None
        delta.text += text
        return None

    @staticmethod
    def request_delta(req: Request, deltas: dict) -> OutputDelta:
        """The request's OutputDelta of this step; `deltas`: Sequence -> StepDelta for those that got a token."""
        asked = req.params.logprobs is not None
        samples = []
        for s in req.sequences:
            d = deltas.get(s)
            samples.append(SampleDelta(s.index, d.text if d else "", d.token_ids if d else [],
                                       (d.logprobs if d else []) if asked else None,
                                       s.finish_reason.value if s.finish_reason else None, s.stop_reason))
        first = not req.announced
        req.announced = True
        prompt_lps = None
        if first and req.params.prompt_logprobs is not None and not req.needs_prompt_logprobs:
            prompt_lps = [None] + req.prompt_logprobs  # the first token has nothing before it
        return OutputDelta(req.request_id, req.prompt_ids if first else None, req.finished, req.cached_tokens,
                           req.error, {"arrival": req.arrival, "first_token": req.first_token_time,
                                       "finish": req.finish_time, "computed_prompt_tokens": req.computed_prompt_tokens},
                           samples, prompt_lps, req.pooled if req.finished else None)
