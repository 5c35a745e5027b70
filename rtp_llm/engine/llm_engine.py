"""LLMEngine: requests in, token/text deltas out, one scheduler step at a time.

    engine = LLMEngine(EngineConfig(model=path))
    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for out in engine.step(): ...

Not thread-safe: one thread drives it (the AsyncEngine runs it on its own thread).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Optional, Sequence as Seq, Union

import torch

from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.distributed.group import TPWorkerError
from rtp_llm.engine.detokenizer import IncrementalDetokenizer
from rtp_llm.engine.errors import QueueFullError, RequestRejected
from rtp_llm.engine.model_runner import ModelRunner, kv_block_count, resolve_block_size
from rtp_llm.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from rtp_llm.engine.scheduler import Scheduler, SchedulerOutput
from rtp_llm.engine.sequence import FinishReason, Request, Sequence, SeqState
from rtp_llm.sampling import GreedyTokens, SamplingBatch, SamplingParams

log = logging.getLogger(__name__)

_GiB = 1 << 30


class LLMEngine:
    def __init__(self, config: EngineConfig, model=None, model_config=None, tokenizer=None):
        from rtp_llm.device import get_device

        self.config = config
        self.device = get_device(config.device)
        self.device.bind_thread()
        self.block_size = resolve_block_size(config, self.device)
        path = config.model
        if path is None:
            from rtp_llm.models.default_model import default_model_path

            path = default_model_path()
        self.model_path = path
        self.tp_runtime = None
        if config.tp_size > 1:
            if model is not None:
                raise ValueError("tp_size > 1 loads its own weight slices on every rank; do not pass a model")
            from rtp_llm.distributed.launch import TPRuntime, launch_env
            from rtp_llm.distributed.sharding import TPShard
            from rtp_llm.models.loader import load_config

            shape = load_config(path, config.model_type)
            for rank in range(config.tp_size):  # refuse an impossible split before starting any process
                TPShard.plan(shape, config.tp_size, rank)
            self.tp_runtime = TPRuntime(config, self.device, launch_env(config.tp_size))
        try:
            self._init_model(config, path, model, model_config, tokenizer)
        except BaseException:
            self.close()
            raise

    def _init_model(self, config: EngineConfig, path: str, model, model_config, tokenizer) -> None:
        from rtp_llm.models.registry import load_model
        from rtp_llm.tokenizer import Tokenizer

        tp = self.tp_runtime.tp if self.tp_runtime else None
        if model is None:
            model, model_config = load_model(path, config.model_type, config.dtype, self.device.torch_device,
                                             allow_pickle=config.allow_pickle, progress=True,
                                             ops=self.device.ops(config), tp=tp)
        self.model, self.model_config = model, model_config
        self.tokenizer = tokenizer or Tokenizer.load(config.tokenizer or path)
        mc = model_config
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        if self.max_model_len > mc.max_position_embeddings:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
                             f"{mc.max_position_embeddings}")
        num_blocks = kv_block_count(config, model.shard.num_kv_heads, mc, model.dtype, self.block_size, self.device)
        if tp is not None:  # every rank's pool has the same block count: the smallest any rank can hold
            num_blocks = tp.all_reduce_min(num_blocks)
        capacity = (num_blocks - 1) * self.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({num_blocks - 1} blocks of {self.block_size}), less than "
                f"max_model_len={self.max_model_len}: give it more memory (kv_cache_memory_gb / num_blocks) "
                f"or lower max_model_len")
        self.runner = ModelRunner(model, mc, num_blocks, self.block_size,
                                  attention=config.attention_backend or self.device.default_attention,
                                  enable_prefix_cache=config.enable_prefix_caching, device=self.device.torch_device,
                                  tp=tp)
        self.manager = self.runner.manager
        self.scheduler = Scheduler(self.manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.prefill_chunk)
        self.requests: dict[str, Request] = {}
        self.eos_ids = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self._rng = random.Random(config.seed)
        self._pending: list[RequestOutput] = []
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "steps": 0}
        log.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB%s); max concurrency at max_model_len=%d: "
                 "%.1f", num_blocks - 1, self.block_size, capacity, self.runner.kv.nbytes / _GiB,
                 f" on rank 0 of {tp.size}" if tp else "", self.max_model_len, capacity / self.max_model_len)

    def close(self) -> None:
        """Stops tensor-parallel workers (if any) and leaves the process group. Idempotent."""
        runtime, self.tp_runtime = getattr(self, "tp_runtime", None), None
        if runtime is not None:
            runtime.close()

    # --- requests ------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Union[str, Seq[int]], params: Optional[SamplingParams] = None,
                    arrival: Optional[float] = None) -> Request:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise RequestRejected("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestRejected(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestRejected(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {len(ids) + params.max_tokens} "
                f"exceeds max_model_len={self.max_model_len}")
        bs = self.block_size
        worst = -(-(len(ids) + params.max_tokens) // bs) + (params.n - 1) * (-(-params.max_tokens // bs) + 1)
        if worst > self.manager.num_blocks - 1:
            raise RequestRejected(f"the request needs up to {worst} KV blocks but the pool has "
                                  f"{self.manager.num_blocks - 1}; lower max_tokens or n")
        if len(self.scheduler.waiting) >= self.config.max_queue_len:
            raise QueueFullError(f"the waiting queue is full ({self.config.max_queue_len} requests)")
        req = Request(request_id, ids, params, arrival=arrival or time.monotonic())
        if params.timeout_ms is not None:
            req.deadline = req.arrival + params.timeout_ms / 1000
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        for i in range(params.n):
            seq = Sequence(self.runner.new_seq_id(), req, i, base_seed + i,
                           IncrementalDetokenizer(self.tokenizer, params.stop))
            req.sequences.append(seq)
        self.requests[request_id] = req
        self.scheduler.add(req.sequences[0])
        for sib in req.sequences[1:]:
            sib.state = SeqState.PENDING_FORK
        return req

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT, error: str | None = None) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        for seq in req.sequences:
            if not seq.finished:
                self._finish(seq, reason)
        req.error = error or req.error
        self._pending.append(self._output(req, {}))
        self._retire(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # --- the step ------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        self._expire()
        outputs.extend(self._pending)
        self._pending = []
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return outputs
        self.counters["steps"] += 1
        try:
            logits = self._forward(sched)
            rows = self._sample_rows(sched)
            sampled = self._sample(logits, rows) if rows else None
        except TPWorkerError:
            raise  # the tensor-parallel group is broken: fatal for the engine
        except Exception as exc:  # a failed step fails its requests, not the engine
            log.exception("step failed")
            for req in {x.seq.request for x in sched.scheduled}:
                if req.request_id in self.requests:
                    self.abort(req.request_id, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
            outputs.extend(self._pending)
            self._pending = []
            return outputs
        deltas: dict[Sequence, tuple[str, list[int], list[TokenLogprob]]] = {}
        for row, (seq, _) in enumerate(rows):
            req = seq.request
            if seq.finished:
                continue
            try:
                self._accept(seq, row, sampled, deltas)
            except Exception as exc:
                log.exception("post-processing failed for request %s", req.request_id)
                self.abort(req.request_id, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
        touched = {s.request for s in deltas}
        for req in touched:
            if req.request_id not in self.requests:
                continue
            outputs.append(self._output(req, deltas))
            if req.finished:
                self._retire(req)
        outputs.extend(self._pending)
        self._pending = []
        return outputs

    def _expire(self) -> None:
        now = time.monotonic()
        for req in [r for r in self.requests.values() if r.deadline is not None and now > r.deadline]:
            self.abort(req.request_id, FinishReason.ABORT, f"timed out after {req.params.timeout_ms} ms")

    def _forward(self, sched: SchedulerOutput) -> torch.Tensor:
        items = sched.scheduled
        for x in items:
            if x.start < len(x.seq.prompt):
                self.counters["prompt_tokens"] += min(len(x.tokens), len(x.seq.prompt) - x.start)
                x.seq.request.computed_prompt_tokens += min(len(x.tokens), len(x.seq.prompt) - x.start)
        try:
            return self.runner.forward([x.seq.seq_id for x in items], [x.tokens for x in items],
                                       [x.start for x in items], [x.slots for x in items],
                                       [x.samples for x in items], sched.copies, greedy=self._greedy_step(items))
        except Exception as exc:
            if self.tp_runtime is None or isinstance(exc, TPWorkerError):
                raise
            # The other ranks may be inside this step's collectives: they cannot be resynchronised.
            raise TPWorkerError(f"tensor-parallel step failed on rank 0: {type(exc).__name__}: {exc}") from exc

    def _greedy_step(self, items) -> bool:
        """Whether only each sampled row's argmax is needed: all greedy, nothing reshaping the logits, no
        sibling to fork, no stop token banned yet by min_tokens."""
        for x in items:
            if x.samples:
                p = x.seq.request.params
                if not GreedyTokens.applies(p) or (len(x.seq.output) < p.min_tokens and self._stop_ids(p)):
                    return False
        return True

    def _sample_rows(self, sched: SchedulerOutput) -> list[tuple[Sequence, int]]:
        """(sequence, logits row) for every token to sample; forks pending siblings off a completed prompt."""
        rows, r = [], 0
        for x in sched.scheduled:
            if not x.samples:
                continue
            rows.append((x.seq, r))
            for sib in x.seq.request.sequences[1:] if x.seq.index == 0 else ():
                if sib.state == SeqState.PENDING_FORK:
                    self.manager.fork(x.seq.seq_id, sib.seq_id)
                    sib.in_manager = True
                    sib.num_computed = x.seq.num_computed
                    sib.known = x.seq.known
                    self.scheduler.start_running(sib)
                    rows.append((sib, r))
            r += 1
        return rows

    def _sample(self, logits: torch.Tensor | GreedyTokens, rows: list[tuple[Sequence, int]]):
        if isinstance(logits, GreedyTokens):  # the model already took each row's argmax (_greedy_step)
            ids = logits.token_ids.cpu().tolist()
            return [ids[r] for _, r in rows], None, None, None
        idx = torch.tensor([r for _, r in rows], dtype=torch.long).to(logits.device)
        if len(rows) != logits.shape[0] or any(i != r for i, (_, r) in enumerate(rows)):
            logits = logits.index_select(0, idx)
        seqs = [s for s, _ in rows]
        params = [s.request.params for s in seqs]
        batch = SamplingBatch.build(params, [s.seed for s in seqs], [len(s.output) for s in seqs],
                                    [s.prompt for s in seqs], [s.output for s in seqs], logits.shape[-1],
                                    logits.device)
        banned = [(i, t) for i, s in enumerate(seqs) if len(s.output) < s.request.params.min_tokens
                  for t in self._stop_ids(s.request.params)]
        if banned:  # min_tokens: stop tokens cannot be generated yet
            bi = torch.tensor([b[0] for b in banned]).to(logits.device)
            bt = torch.tensor([b[1] for b in banned]).to(logits.device)
            logits = logits.clone()
            logits[bi, bt] = float("-inf")
        out = self.runner.sampler(logits, batch)
        # The only device -> host copies of a step: R token ids (and logprobs when asked).
        return (out.token_ids.cpu().tolist(),
                out.logprobs.cpu().tolist() if out.logprobs is not None else None,
                out.top_ids.cpu().tolist() if out.top_ids is not None else None,
                out.top_logprobs.cpu().tolist() if out.top_logprobs is not None else None)

    def _stop_ids(self, params: SamplingParams) -> set[int]:
        return set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)

    def _accept(self, seq: Sequence, row: int, sampled, deltas) -> None:
        tokens, lps, top_ids, top_lps = sampled
        tok = tokens[row]
        req, params = seq.request, seq.request.params
        seq.output.append(tok)
        self.counters["generation_tokens"] += 1
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        lp = None
        if params.logprobs is not None:
            top = list(zip(top_ids[row][: params.logprobs], top_lps[row][: params.logprobs])) if top_ids else []
            lp = TokenLogprob(tok, lps[row], top)
            seq.logprobs.append(lp)
        text = ""
        stop_ids = self._stop_ids(params)
        n_out = len(seq.output)
        if tok in stop_ids and n_out > params.min_tokens:
            self._finish(seq, FinishReason.STOP, stop_reason=tok)
        else:
            detok = seq.detok
            if n_out <= params.min_tokens and detok.stop:
                saved, detok.stop = detok.stop, []  # min_tokens: no stop strings yet
                text = detok.add(tok)
                detok.stop = saved
            else:
                text = detok.add(tok)
            if detok.stopped_by is not None:
                self._finish(seq, FinishReason.STOP, stop_reason=detok.stopped_by)
            elif n_out >= params.max_tokens or seq.num_tokens >= self.max_model_len:
                text += detok.flush()
                self._finish(seq, FinishReason.LENGTH)
        d = deltas.setdefault(seq, ["", [], []])
        d[0] += text
        d[1].append(tok)
        if lp is not None:
            d[2].append(lp)

    def _finish(self, seq: Sequence, reason: FinishReason, stop_reason=None) -> None:
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self.scheduler.remove(seq)
        seq.state = SeqState.FINISHED
        if seq.request.finished and seq.request.finish_time is None:
            seq.request.finish_time = time.monotonic()

    def _retire(self, req: Request) -> None:
        if self.requests.pop(req.request_id, None) is not None:
            self.counters["requests_finished"] += 1

    def _output(self, req: Request, deltas) -> RequestOutput:
        outs = []
        for s in req.sequences:
            d = deltas.get(s, ("", [], []))
            outs.append(CompletionOutput(
                index=s.index, text=s.detok.text[: s.detok.emitted], token_ids=list(s.output),
                delta_text=d[0], delta_token_ids=list(d[1]),
                logprobs=list(s.logprobs) if req.params.logprobs is not None else None,
                delta_logprobs=list(d[2]) if req.params.logprobs is not None else None,
                finish_reason=s.finish_reason.value if s.finish_reason else None, stop_reason=s.stop_reason))
        return RequestOutput(req.request_id, req.prompt_ids, outs, req.finished, req.cached_tokens, req.error,
                             {"arrival": req.arrival, "first_token": req.first_token_time, "finish": req.finish_time,
                              "computed_prompt_tokens": req.computed_prompt_tokens})

    # --- introspection -------------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.manager.stats()
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_total_blocks": s.total_blocks,
            "kv_used_blocks": s.used_blocks,
            "kv_free_blocks": s.free_blocks,
            "kv_cached_blocks": s.cached_blocks,
            "kv_usage": s.used_blocks / s.total_blocks,
            "prefix_hit_rate": s.hit_rate,
            "prefix_hit_tokens": s.prefix_hit_tokens,
            "preemptions": self.scheduler.num_preemptions,
            **self.counters,
        }
