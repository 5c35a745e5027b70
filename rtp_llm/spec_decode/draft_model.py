"""A draft model: any supported checkpoint with the target's tokenizer drafts k tokens per step, with its own KV
cache (its own KVCacheManager over its own KVBuffer, on the target's device).

The draft reads a sequence's prompt in the step that computed the target's (warm: before the first token is
sampled, so it counts in the time to the first token). Per step, for the sequences that draft: one forward catches
the draft's KV up with the sequence (the accepted tokens and the bonus token) and samples draft 1 from the last row;
k - 1 one-token forwards sample the rest. A draft row samples as the target's row would (the request's
temperature, top-k/p, penalties and bias, its seed and step), so a seeded request's draft follows the same noise as
its verification (engine/core.py keeps a draft while it equals the target's sample), and a constrained request's
under a copy of its grammar that follows the drafts. After verification the draft's KV keeps what was accepted.
The draft's KV holds (disable_by_batch_size + 1) x max_model_len tokens at most; a sequence that does not fit after
evicting the least recently drafted ones drafts nothing that step.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

from rtp_llm.cache import KVBuffer, KVCacheManager, OutOfBlocksError
from rtp_llm.device.forward_batch import ForwardBatch
from rtp_llm.errors import MissingFileError
from rtp_llm.sampling import Sampler, SamplingBatch
from rtp_llm.sampling.grammar import Grammar
from rtp_llm.spec_decode.proposer import Proposer

log = logging.getLogger(__name__)


class DraftModelProposer(Proposer):
    name = "draft_model"

    def __init__(self, config, target, max_batch: int):
        """target: the EngineCore it drafts for (its config, device, tokenizer, limits and KV pool size)."""
        from rtp_llm.models.registry import load_engine_model
        from rtp_llm.tokenizer import Tokenizer

        tc = target.config
        # Under tensor parallelism the draft runs whole in rank 0's process (it is small; its drafts reach the other
        # ranks in the step message like n-gram drafts), and the target's ranks verify them together.
        dc = dataclasses.replace(tc, model=config.model, tokenizer=None, model_type=None, speculative_config=None,
                                 dtype=config.dtype or tc.dtype, quantization=config.quantization or tc.quantization,
                                 tp_size=1)
        device = target.device
        self.model, self.cfg = load_engine_model(dc, device)
        self.vocab = min(self.cfg.vocab_size, target.vocab_size)
        self.target_vocab = target.vocab_size
        self.grammars = target.grammars  # a constrained request's drafts are sampled under its grammar
        try:
            draft_vocab = Tokenizer.load(config.model).backend.get_vocab()
        except MissingFileError:  # a checkpoint without tokenizer files: taken to share the target's, as vLLM does
            log.warning("the draft model %s has no tokenizer of its own: it is taken to share the target's",
                        config.model)
        else:
            if draft_vocab != target.tokenizer.backend.get_vocab():
                raise ValueError(f"speculative_config: the draft model {config.model} has another tokenizer than the "
                                 f"target's: its drafts would be other tokens")
        if self.cfg.max_position_embeddings < target.max_model_len:
            raise ValueError(f"speculative_config: the draft model's max_position_embeddings "
                             f"({self.cfg.max_position_embeddings}) is below max_model_len={target.max_model_len}")
        self.block_size = target.block_size
        tokens = min((max_batch + 1) * target.max_model_len, target.scheduler.manager.num_blocks * self.block_size)
        num_blocks = -(-tokens // self.block_size) + 1
        shard = self.model.shard
        self.manager = KVCacheManager(num_blocks, self.block_size, enable_prefix_cache=False)
        self.kv = KVBuffer(self.cfg.num_layers, num_blocks, self.block_size, shard.num_kv_heads, self.cfg.head_dim,
                           dtype=self.model.dtype, device=device.torch_device, zeros=device.zeros)
        self.attn = device.attention_backend(tc.attention_backend)(shard.num_heads, shard.num_kv_heads,
                                                                   self.cfg.head_dim, self.cfg.head_dim ** -0.5,
                                                                   self.block_size)
        self.device = device.torch_device
        self.sampler = Sampler(self.model.ops)
        # seq_id -> [context length, drafts, verified] of its last proposal, least recently drafted first
        self._lru: OrderedDict = OrderedDict()
        log.info("draft model %s (%s, %d layers, %s): KV for %d tokens (%.2f GiB)", config.model,
                 self.cfg.model_type, self.cfg.num_layers, self.model.dtype, (num_blocks - 1) * self.block_size,
                 self.kv.nbytes / (1 << 30))

    # --- the KV of the draft ---------------------------------------------------------------------------------
    def _catch_up(self, s, keep: set) -> np.ndarray | None:
        """Slots for the tokens of s the draft has not computed (its whole context the first time)."""
        m, sid = self.manager, s.seq_id
        tokens = s.all_tokens()
        if max(tokens) >= self.vocab:
            return None
        state = self._lru.get(sid)
        if state is not None and not state[2] and m.has_sequence(sid):
            m.truncate(sid, state[0])  # last step's drafts were never verified (the scheduler dropped them)
        if not m.has_sequence(sid):
            m.add_sequence(sid, tokens, reuse_prefix=False)
        elif m.num_tokens(sid) < len(tokens):
            m.extend_tokens(sid, tokens[m.num_tokens(sid):])
        n = len(tokens) - m.num_slots(sid)
        while True:
            slots = np.empty(n, dtype=np.int32)
            try:
                m.append_slots(sid, slots)
                return slots
            except OutOfBlocksError:
                victim = next((v for v in self._lru if v not in keep and v != sid), None)
                if victim is None:
                    return None
                self._drop(victim)

    def _drop(self, seq_id: int) -> None:
        self._lru.pop(seq_id, None)
        if self.manager.has_sequence(seq_id):
            self.manager.free(seq_id)

    def _forward(self, ids, tokens, starts, slots, logits: bool = True):
        width = max(-(-(st + len(t)) // self.block_size) for st, t in zip(starts, tokens))
        table = np.empty((len(ids), width), dtype=np.int32)
        self.manager.fill_block_tables(np.asarray(ids, dtype=np.int64), table)
        batch = ForwardBatch.build(tokens, starts, slots, table, self.block_size, [int(logits)] * len(ids),
                                   self.device)
        h = self.model(batch, self.kv, self.attn)
        return self.model.compute_logits(h)[:, :self.vocab] if logits else None

    def _catch_up_all(self, seqs, keep: set) -> tuple[list, list]:
        """Slots for every sequence's tokens the draft has not computed; the ones that got them."""
        live, slots = [], []
        for s in seqs:
            sl = self._catch_up(s, keep)
            if sl is not None and len(sl):
                live.append(s)
                slots.append(sl)
        return live, slots

    def warm(self, seqs: Sequence) -> None:
        live, slots = self._catch_up_all(seqs, {s.seq_id for s in seqs})
        if not live:
            return
        m = self.manager
        starts = [m.num_slots(s.seq_id) - len(sl) for s, sl in zip(live, slots)]
        self._forward([s.seq_id for s in live], [s.all_tokens()[st:st + len(sl)] for s, st, sl in
                                                 zip(live, starts, slots)], starts, slots, logits=False)
        for s in live:
            self._lru.pop(s.seq_id, None)
            self._lru[s.seq_id] = [s.num_tokens, 0, True]

    def _sample(self, seqs, drafts, logits, walked: dict) -> list[int]:
        """Each row as the target would sample it after the drafts so far (a constrained sequence under a copy of
        its grammar that has consumed them: `walked`)."""
        outputs = [s.output + d for s, d in zip(seqs, drafts)]
        batch = SamplingBatch.build([s.request.params for s in seqs], [s.seed for s in seqs],
                                    [len(o) for o in outputs], [s.prompt for s in seqs], outputs, logits.shape[-1],
                                    logits.device)
        constrained = [(i, walked[s]) for i, s in enumerate(seqs) if s in walked]
        if constrained:
            masks = self.grammars.masks([g for _, g in constrained], self.target_vocab)[:, :logits.shape[-1]]
            batch.grammar = (torch.tensor([i for i, _ in constrained], dtype=torch.long).to(logits.device),
                             masks.to(logits.device))
        return self.sampler(logits, batch).token_ids.cpu().tolist()

    @staticmethod
    def _walk(s, drafts: list[int], walked: dict) -> bool:
        """Feeds s's newest draft to its grammar's copy (constrained sequences); False when the grammar refuses it."""
        g = walked.get(s)
        if g is None:
            return True
        t = int(drafts[-1])
        m = g.matcher
        return not m.is_stopped() and m.validate_tokens([t]) == 1 and m.consume_token(t)

    # --- the interface ------------------------------------------------------------------------------------------
    def propose(self, seqs: Sequence, ks: Sequence[int], hidden=None) -> list[list[int]]:
        live, slots = self._catch_up_all(seqs, {s.seq_id for s in seqs})
        drafts: dict = {s: [] for s in seqs}
        if not live:
            return [[] for _ in seqs]
        m = self.manager
        starts = [m.num_slots(s.seq_id) - len(sl) for s, sl in zip(live, slots)]
        logits = self._forward([s.seq_id for s in live], [s.all_tokens()[st:] for s, st in zip(live, starts)], starts,
                               slots)
        # constrained sequences: a copy of the grammar that follows the drafts (the sequence's own stays put)
        walked = {s: Grammar(s.grammar.matcher.deep_copy()) for s in live
                  if s.grammar is not None and s.grammar.active}
        for s, t in zip(live, self._sample(live, [[]] * len(live), logits, walked)):
            drafts[s].append(t)
        k_of = dict(zip((s.seq_id for s in seqs), ks))
        self._draft_rest(live, drafts, k_of, walked)
        for s in seqs:
            if m.has_sequence(s.seq_id):
                self._lru.pop(s.seq_id, None)
                self._lru[s.seq_id] = [s.num_tokens, len(drafts[s]), False]
        return [drafts[s] for s in seqs]

    def _draft_rest(self, live, drafts, k_of, walked) -> None:
        """Drafts 2..k: one-token forwards of the newest draft, batched over the sequences still drafting."""
        m = self.manager
        while True:
            live = [s for s in live if len(drafts[s]) < k_of[s.seq_id] and self._walk(s, drafts[s], walked)]
            if not live:
                break
            ids = np.fromiter((s.seq_id for s in live), dtype=np.int64, count=len(live))
            toks = np.fromiter((drafts[s][-1] for s in live), dtype=np.int32, count=len(live))
            sl = np.empty(len(live), dtype=np.int32)
            try:
                m.append_decode(ids, toks, sl)
            except OutOfBlocksError:
                break  # the drafts so far stand
            starts = [m.num_slots(s.seq_id) - 1 for s in live]
            logits = self._forward(list(ids), [[t] for t in toks.tolist()], starts,
                                   [sl[i:i + 1] for i in range(len(live))])
            for s, t in zip(live, self._sample(live, [drafts[s] for s in live], logits, walked)):
                drafts[s].append(t)

    def accepted(self, seq, num_accepted: int) -> None:
        """The draft's KV keeps the context it drafted from and the accepted drafts it computed (the last draft
        was sampled, never computed)."""
        state = self._lru.get(seq.seq_id)
        if state is None or not self.manager.has_sequence(seq.seq_id):
            return
        context, drafted, _ = state
        keep = context + min(num_accepted, max(drafted - 1, 0))
        self.manager.truncate(seq.seq_id, min(keep, self.manager.num_tokens(seq.seq_id)))
        state[2] = True

    def release(self, seq) -> None:
        self._drop(seq.seq_id)
