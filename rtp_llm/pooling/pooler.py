"""Pooler: the prompt rows' final hidden states -> what a pooling request asked for. Rows are gathered into one
float32 [prompt, hidden] tensor by position, so the result is the same however the prefill was chunked or
preempted; every reduction runs on one request's rows alone, so it is the same whatever shares the batch."""

from __future__ import annotations

from typing import Optional, Sequence

import logging

import torch
import torch.nn.functional as F

from rtp_llm.pooling.config import PoolerConfig
from rtp_llm.pooling.params import PoolingParams

log = logging.getLogger(__name__)


class Pooler:
    def __init__(self, model, config: PoolerConfig, classifier_token_ids: Optional[Sequence[int]] = None):
        """classifier_token_ids: (no, yes) of a causal LM read as a one-label classifier (Qwen3-Reranker)."""
        self.model = model
        self.config = config
        self.from_tokens = tuple(classifier_token_ids) if classifier_token_ids else None
        head = model.cfg.head
        self.tasks = ("score", "classify") if head == "score" or self.from_tokens else ("embed",)

    @classmethod
    def for_engine(cls, model, path, tokenizer, override=None) -> "Pooler":
        """The pooler of a loaded model: its checkpoint's pooling (or --pooler_config), the classifier tokens'
        ids from the tokenizer."""
        mc = model.cfg
        tokens = None
        if mc.classifier_from_token:
            tokens = [tokenizer.encode(t, add_special_tokens=False) for t in mc.classifier_from_token]
            if any(len(t) != 1 for t in tokens):
                raise ValueError(f"classifier_from_token {mc.classifier_from_token}: each must be one token of the "
                                 f"tokenizer")
            tokens = [t[0] for t in tokens]
        pooler = cls(model, PoolerConfig.for_model(path, mc.head, override), tokens)
        log.info("pooling runner: %s pooling%s; tasks %s", pooler.config.pooling_type.lower(),
                 ", normalised" if pooler.config.normalize and "embed" in pooler.tasks else "", ", ".join(pooler.tasks))
        return pooler

    def rows_wanted(self) -> str:
        """Which prompt rows the pooling reads beyond the last: "all" (mean), "first" (CLS) or "" (last token)."""
        return {"MEAN": "all", "CLS": "first", "LAST": ""}[self.config.pooling_type]

    def add_rows(self, req, start: int, rows: torch.Tensor) -> None:
        """Hidden states of prompt positions start.. of the request (a prefill chunk's rows)."""
        if req.pool_rows is None:
            req.pool_rows = torch.empty(len(req.prompt_ids), rows.shape[-1], dtype=torch.float32)
        req.pool_rows[start:start + rows.shape[0]] = rows.float().cpu()

    def finish(self, req, last: torch.Tensor) -> list[float]:
        """The request's result once its prompt is complete; `last`: the last prompt row's hidden state."""
        kind = self.config.pooling_type
        if kind == "LAST":
            v = last.float()
        elif kind == "MEAN":
            v = req.pool_rows.mean(dim=0)
        else:
            v = req.pool_rows[0]
        req.pool_rows = None
        params: PoolingParams = req.pooling
        if params.task == "embed":
            return self._embedding(v, params)
        return self._scores(v, last, params)

    def _embedding(self, v: torch.Tensor, params: PoolingParams) -> list[float]:
        if params.dimensions is not None:
            v = v[:params.dimensions]
        normalize = self.config.normalize if params.normalize is None else params.normalize
        if normalize:
            v = F.normalize(v, dim=-1)
        return v.cpu().tolist()

    def _scores(self, v: torch.Tensor, last: torch.Tensor, params: PoolingParams) -> list[float]:
        if self.from_tokens is not None:  # the 2-way softmax of the two tokens' logits: sigmoid(yes - no)
            logits = self.model.compute_logits(last[None].to(self.model.dtype))[0]
            no, yes = (logits[i].float() for i in self.from_tokens)
            logits = (yes - no)[None]
        else:
            logits = torch.mv(self.model.score.float().cpu(), v.cpu())
        if params.activation:
            logits = torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=-1)
        return logits.cpu().tolist()
