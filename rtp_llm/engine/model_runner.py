"""ModelRunner: runs one scheduled step: the model's forward on the step's flat batch, then the sampler on the
rows that sample. It owns the KV buffer, the attention backend and the sampler; the block accounting is the
scheduler's.

With tensor parallelism, rank 0's runner broadcasts each step's inputs (distributed/step_message.py) before
running it; the other ranks (engine/tp_worker.py) run `forward` on what they receive.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from rtp_llm.cache import KVBuffer
from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import Device
from rtp_llm.device.forward_batch import ForwardBatch
from rtp_llm.distributed.step_message import StepMessage
from rtp_llm.engine.outputs import TokenLogprob
from rtp_llm.engine.scheduler import SchedulerOutput
from rtp_llm.engine.sequence import Sequence
from rtp_llm.errors import TPWorkerError
from rtp_llm.models.decoder import DecoderLM
from rtp_llm.sampling import GreedyTokens, Sampler
from rtp_llm.sampling.grammar import GrammarCompiler
from rtp_llm.sampling.input_batch import InputBatch
from rtp_llm.sampling.penalties import TokenCounts


@dataclass
class RunnerOutput:
    """The sampled token of every sample row of the step (SchedulerOutput.sample_rows, in order), host lists."""
    token_ids: list[int]
    logprobs: Optional[list[float]] = None
    top_ids: Optional[list[list[int]]] = None
    top_logprobs: Optional[list[list[float]]] = None
    # (sequence, first prompt position, logprobs of the prompt tokens after it) for the step's prompt rows
    prompt_logprobs: list[tuple[Sequence, int, list[TokenLogprob]]] = field(default_factory=list)
    # a pooling runner's step: the result of every sequence whose prompt it completed (token_ids is empty)
    pooled: Optional[dict[Sequence, list[float]]] = None


class ModelRunner:
    def __init__(self, model: DecoderLM, cfg: ModelConfig, num_blocks: int, block_size: int, device: Device,
                 attention: Optional[str] = None, tp=None, grammars: Optional[GrammarCompiler] = None):
        self.model, self.cfg = model, cfg
        self.grammars = grammars  # computes the token masks of constrained rows
        self.block_size = block_size
        self.device = device.torch_device
        self.tp = tp if tp is not None and tp.size > 1 else None
        heads, kv_heads = model.shard.num_heads, model.shard.num_kv_heads  # this rank's share
        self.kv = KVBuffer(cfg.num_layers, num_blocks, block_size, kv_heads, cfg.head_dim, dtype=model.dtype,
                           device=self.device, zeros=device.zeros)
        self.attn = device.attention_backend(attention)(heads, kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                                                        block_size)
        self.sampler = Sampler(model.ops)
        self.input_batch = InputBatch(cfg.vocab_size, self.device)  # the sampled rows' parameters, kept across steps
        self.pooler = None  # --runner pooling: rtp_llm/pooling/Pooler, set by the core
        self.pools = False  # --runner pooling on a rank > 0 (tp_worker): steps without logits
        self.lora = None    # --enable_lora: rtp_llm/lora/LoRAManager, set by the core
        self.graphs = None  # Device.decode_graphs: decode steps replayed from captured graphs, set by the core


    # --- the step ----------------------------------------------------------------------------------------------
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        self.input_batch.remove(sched.finished)
        items = sched.scheduled
        tokens, starts, slots = [x.tokens for x in items], [x.start for x in items], [x.slots for x in items]
        need = [x.need_logits for x in items]
        loras = [x.seq.request.lora_id or 0 for x in items] if self.lora is not None else []
        with self._lora_step(loras, tokens):
            return self._execute(sched, tokens, starts, slots, need, loras)

    @contextlib.contextmanager
    def _lora_step(self, loras: list[int], tokens):
        """The step's rows grouped by LoRA adapter (loras: each sequence's adapter id, 0 for none) while it runs."""
        if self.lora is None:
            yield
            return
        rows: dict[int, list[int]] = {}
        offset = 0
        for lora, t in zip(loras, tokens):
            if lora:
                rows.setdefault(lora, []).extend(range(offset, offset + len(t)))
            offset += len(t)
        self.lora.set_step(rows)
        try:
            yield
        finally:
            self.lora.clear_step()

    def _execute(self, sched: SchedulerOutput, tokens, starts, slots, need, loras) -> RunnerOutput:
        greedy = self.pooler is None and self._greedy_step(sched) and not sched.prompt_rows
        try:
            if self.tp is not None:  # the other ranks run the same step from its message
                adapters = self.lora.untold(loras) if self.lora is not None else []
                self.tp.send_step(StepMessage([np.asarray(t) for t in tokens], starts, slots, need, sched.block_table,
                                              list(sched.copies), loras, adapters))
            batch = ForwardBatch.build(tokens, starts, slots, sched.block_table, self.block_size, need, self.device)
            if self.pooler is not None:
                return self._pool(batch, sched)
            out = self._run(batch, sched.copies, greedy)
        except Exception as exc:
            if self.tp is None or isinstance(exc, TPWorkerError):
                raise
            # The other ranks may be inside this step's collectives: they cannot be resynchronised.
            raise TPWorkerError(f"tensor-parallel step failed on rank 0: {type(exc).__name__}: {exc}") from exc
        result = self._sample(out, sched.sample_rows, sched.sample_ahead)
        result.prompt_logprobs = [self._prompt_logprobs(out, *rows) for rows in sched.prompt_rows]
        return result

    def _pool(self, batch: ForwardBatch, sched: SchedulerOutput) -> RunnerOutput:
        """A pooling step: the hidden states of the rows pooling reads, no logits (under tensor parallelism every
        rank holds them whole after the last all-reduce; rank 0 pools)."""
        self.kv.copy_blocks(sched.copies)
        h = self.model(batch, self.kv, self.attn)
        for seq, start, first, count in sched.prompt_rows:
            self.pooler.add_rows(seq.request, start, h[first:first + count])
        return RunnerOutput([], pooled={seq: self.pooler.finish(seq.request, h[row]) for seq, row in sched.sample_rows})

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, seq: Sequence, start: int, first: int,
                         count: int) -> tuple[Sequence, int, list[TokenLogprob]]:
        """Rows first.. of the logits are positions start..: each gives the next prompt token's logprob (of the raw
        logits, as sampled tokens' are), its rank and the top ones asked for."""
        prompt = seq.prompt
        n = min(count, len(prompt) - 1 - start)  # the last prompt position predicts an output token
        logp = torch.log_softmax(logits[first:first + n].float(), dim=-1)
        target = torch.tensor(prompt[start + 1:start + 1 + n], dtype=torch.long).to(logp.device)
        chosen = logp.gather(-1, target[:, None])
        ranks = (logp > chosen).sum(-1) + 1
        k = seq.request.params.prompt_logprobs
        top_v, top_i = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], target[:, None][:, :0])
        chosen, ranks, top_v, top_i = (t.cpu().tolist() for t in (chosen, ranks, top_v, top_i))
        return seq, start, [TokenLogprob(prompt[start + 1 + j], chosen[j][0], list(zip(top_i[j], top_v[j])), ranks[j])
                            for j in range(n)]

    def forward(self, step: StepMessage, greedy: bool = False):
        """A step as its message gives it (tensor-parallel ranks 1.., tests): float32 logits of the rows that
        sample (only on rank 0), or with `greedy` possibly their argmax only (GreedyTokens)."""
        batch = ForwardBatch.build(step.tokens, step.starts, step.slots, step.block_table, self.block_size,
                                   step.need_logits, self.device)
        if self.pools:  # a pooling engine's other ranks: the forward's collectives, no logits
            self.kv.copy_blocks(step.copies)
            self.model(batch, self.kv, self.attn)
            return None
        if self.lora is not None:
            self.lora.learn(step.adapters)
        with self._lora_step(step.loras, step.tokens):
            return self._run(batch, step.copies, greedy)

    def _run(self, batch: ForwardBatch, copies, greedy: bool):
        """The model call itself, identical on every tensor-parallel rank."""
        self.kv.copy_blocks(copies)
        if self.graphs is not None and self.model.observer is None and self.lora is None and self.graphs.runs(batch):
            logits = self.graphs(batch)
            if logits is not None:
                return logits
        h = self.model(batch, self.kv, self.attn)
        observer = self.model.observer  # an observed step reports its logits (rtp_llm/tools/compare.py)
        if greedy and self.model.has_greedy_head and observer is None:
            return GreedyTokens(self.model.greedy_token_ids(h))
        logits = self.model.compute_logits(h)
        if observer is not None:
            observer("logits", logits)
        return logits

    @staticmethod
    def _greedy_step(sched: SchedulerOutput) -> bool:
        """Whether only each sampled row's argmax is needed: every sample greedy with nothing reshaping its logits,
        no sibling to fork, no stop token banned yet by min_tokens."""
        return all(GreedyTokens.applies(s.request.params) and not s.bans_stop_ids(j)
                   for (s, _), j in zip(sched.sample_rows, sched.sample_ahead))

    def _sample(self, logits, rows, ahead=None) -> RunnerOutput:
        """Samples every row; a speculating sequence's row j (ahead[i] = j) as plain decoding would sample it after
        its first j drafts: those count as output for penalties, bad words, min_tokens, the grammar and the seeded
        draw's step."""
        if not rows:
            return RunnerOutput([])
        ahead = ahead or [0] * len(rows)
        if isinstance(logits, GreedyTokens):  # the model already took each row's argmax
            ids = logits.token_ids.cpu().tolist()
            return RunnerOutput([ids[r] for _, r in rows])
        if len(rows) != logits.shape[0] or any(i != r for i, (_, r) in enumerate(rows)):
            logits = logits.index_select(0, torch.tensor([r for _, r in rows], dtype=torch.long).to(logits.device))
        seqs = [s for s, _ in rows]
        outputs = [s.output + s.draft[:j] if j else s.output for s, j in zip(seqs, ahead)]
        rows = self.input_batch
        if rows.vocab_size != logits.shape[-1]:  # a model whose logits are wider than its config's vocabulary
            rows = self.input_batch = InputBatch(logits.shape[-1], logits.device)
        for s in seqs:
            if s not in rows:
                rows.add(s, s.request.params, s.seed)
        batch = rows.batch(seqs, [len(o) for o in outputs], outputs,
                           [self._token_counts(s, j) for s, j in zip(seqs, ahead)])
        banned = [(i, t) for i, (s, j) in enumerate(zip(seqs, ahead)) if s.bans_stop_ids(j)
                  for t in s.request.min_tokens_ids]
        if banned:  # min_tokens: stop tokens cannot be generated yet
            bi = torch.tensor([b[0] for b in banned]).to(logits.device)
            bt = torch.tensor([b[1] for b in banned]).to(logits.device)
            logits = logits.clone()
            logits[bi, bt] = float("-inf")
        grammar = self._grammar_masks(seqs, ahead, logits.shape[-1])
        if grammar is not None:
            batch.grammar = (grammar[0].to(logits.device), grammar[1].to(logits.device))
        out = self.sampler(logits, batch)
        # The only device -> host copies of a step: R token ids (and logprobs when asked).
        return RunnerOutput(out.token_ids.cpu().tolist(),
                            out.logprobs.cpu().tolist() if out.logprobs is not None else None,
                            out.top_ids.cpu().tolist() if out.top_ids is not None else None,
                            out.top_logprobs.cpu().tolist() if out.top_logprobs is not None else None)

    @staticmethod
    def _token_counts(seq: Sequence, ahead: int) -> Optional[TokenCounts]:
        """A penalised sequence's seen tokens, kept on the sequence and brought up to its output; a speculating
        row's with its first `ahead` drafts counted too."""
        if not seq.request.params.penalises:
            return None
        if seq.token_counts is None:
            seq.token_counts = TokenCounts(seq.prompt, seq.output)
        counts = seq.token_counts.follow(seq.output)
        return counts.plus(seq.draft[:ahead]) if ahead else counts

    def _grammar_masks(self, seqs, ahead, vocab: int):
        """(rows, allowed [G, vocab]) of the constrained rows, computed on the host; a speculating sequence's rows
        from a copy of its matcher walked along its drafts."""
        plain = [(i, s.grammar) for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.active
                 and not s.draft]
        spec = [(i, s) for i, (s, j) in enumerate(zip(seqs, ahead)) if j == 0 and s.draft and s.grammar is not None
                and s.grammar.active]
        if not plain and not spec:
            return None
        rows, masks = [], []
        if plain:
            rows += [i for i, _ in plain]
            masks.append(self.grammars.masks([g for _, g in plain], vocab))
        for i, s in spec:
            rows += range(i, i + len(s.draft) + 1)
            masks.append(self.grammars.masks_along(s.grammar, s.draft, vocab))
        return torch.tensor(rows, dtype=torch.long), torch.cat(masks)
