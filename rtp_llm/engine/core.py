"""EngineCore: EngineRequests in, OutputDeltas out, one scheduler step at a time.

    core = EngineCore(EngineConfig(model=path))
    core.add_request(core.input_processor().process("r1", "Hi"))
    while core.has_unfinished():
        deltas = core.step()   # an OutputCollector turns them into RequestOutputs

step() is schedule -> runner.execute -> update_from_output. Not thread-safe: one thread drives it (core_loop.py
runs it on a thread or in the engine process).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from typing import Optional

from rtp_llm.cache import kv_cache_blocks
from rtp_llm.config.engine_config import EngineConfig
from rtp_llm.device import get_device
from rtp_llm.engine.admissions import GRAMMAR, LORA, Admissions
from rtp_llm.engine.detokenizer import IncrementalDetokenizer
from rtp_llm.engine.input_processor import InputProcessor
from rtp_llm.engine.model_runner import ModelRunner, RunnerOutput
from rtp_llm.engine.output_processor import OutputProcessor, StepDelta
from rtp_llm.engine.outputs import TokenLogprob
from rtp_llm.engine.protocol import EngineRequest, InputLimits, OutputDelta
from rtp_llm.engine.scheduler import Scheduler, SchedulerOutput
from rtp_llm.engine.sequence import FinishReason, Request, Sequence, SeqState
from rtp_llm.errors import QueueFullError, RequestRejected, TPWorkerError
from rtp_llm.lora import LoRAManager
from rtp_llm.models.default_model import with_default_model
from rtp_llm.models.gguf_reader import shared_gguf_files
from rtp_llm.pooling import runs_pooling
from rtp_llm.sampling.grammar import GrammarCompiler

log = logging.getLogger(__name__)

_GiB = 1 << 30


class EngineCore:
    def __init__(self, config: EngineConfig, model=None, model_config=None, tokenizer=None):
        config = with_default_model(config)
        self.config = config
        self.device = get_device(config.device, options=config.device_options)
        self.device.bind_thread()
        self.block_size = config.block_size or self.device.default_block_size
        self.device.validate_block_size(self.block_size)
        self.model_path = config.model
        self.tp_runtime = None
        with shared_gguf_files():  # a GGUF's metadata parsed once for the config, plan, weights and tokenizer
            self._load(config, model, model_config, tokenizer)

    def _load(self, config: EngineConfig, model, model_config, tokenizer) -> None:
        if config.tp_size > 1:
            if model is not None:
                raise ValueError("tp_size > 1 loads its own weight slices on every rank; do not pass a model")
            from rtp_llm.distributed.launch import TPRuntime, launch_env
            from rtp_llm.models.loader import load_config
            from rtp_llm.models.sharding import TPShard

            shape = load_config(config.model, config.model_type, config.hf_overrides)
            for rank in range(config.tp_size):  # refuse an impossible split before starting any process
                TPShard.plan(shape, config.tp_size, rank)
            self.tp_runtime = TPRuntime(config, self.device, launch_env(config.tp_size))
        try:
            self._init_model(config, model, model_config, tokenizer)
        except BaseException:
            self.close()
            raise

    def _init_model(self, config: EngineConfig, model, model_config, tokenizer) -> None:
        from rtp_llm.models.registry import load_engine_model, memory_plan
        from rtp_llm.tokenizer import Tokenizer

        tp = self.tp_runtime.tp if self.tp_runtime else None
        if model is None:
            from rtp_llm.models.loader import load_config

            self.device.check_model(load_config(config.model, config.model_type, config.hf_overrides))
            if tp is None:  # tensor-parallel ranks hold shares: each rank's device answers for its own
                self.device.check_fits(*memory_plan(config, self.device, self.block_size))
            model, model_config = load_engine_model(config, self.device, tp, progress=True)
        self.model_config = mc = model_config
        self.tokenizer = tokenizer or Tokenizer.load(config.tokenizer or config.model)
        self.vocab_size = mc.vocab_size
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        if self.max_model_len > mc.max_position_embeddings:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
                             f"{mc.max_position_embeddings}")
        num_blocks = kv_cache_blocks(config, self.device, mc.num_layers, self.block_size, model.shard.num_kv_heads,
                                     mc.head_dim, model.dtype)
        if tp is not None:  # every rank's pool has the same block count: the smallest any rank can hold
            num_blocks = tp.all_reduce_min(num_blocks)
        capacity = (num_blocks - 1) * self.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({num_blocks - 1} blocks of {self.block_size}), less than "
                f"max_model_len={self.max_model_len}: give it more memory (kv_cache_memory_gb / num_blocks) "
                f"or lower max_model_len")
        self.pooling = runs_pooling(config.runner, mc)
        # a pooling request reads every position it pools from its own prefill: nothing to cache for later
        self.scheduler = Scheduler(num_blocks, self.block_size, config.enable_prefix_caching and not self.pooling,
                                   config.max_num_seqs, config.max_num_batched_tokens, config.prefill_chunk,
                                   config.max_loras)
        self.eos_ids = frozenset(mc.eos_token_ids) | (
            frozenset() if self.tokenizer.eos_token_id is None else {self.tokenizer.eos_token_id})
        self.grammars = GrammarCompiler(self.tokenizer, mc.vocab_size, self.eos_ids)
        self.runner = ModelRunner(model, mc, num_blocks, self.block_size, self.device, config.attention_backend, tp,
                                  self.grammars)
        if tp is None and not self.pooling:  # decode steps from captured graphs where the device has them
            self.runner.graphs = self.device.decode_graphs(model, self.runner.kv, self.runner.attn, self.block_size,
                                                           self.max_model_len, config.max_num_seqs)
        self.output = OutputProcessor(self.max_model_len)
        if self.pooling:
            from rtp_llm.pooling import Pooler

            if config.speculative is not None or (tp is not None and mc.classifier_from_token is not None):
                raise ValueError("--runner pooling runs without speculative decoding, and a classifier read from an "
                                 "LM head (classifier_from_token) on one rank (tp_size 1)")
            self.runner.pooler = Pooler.for_engine(model, config.model, self.tokenizer, config.pooler_config)
        self.lora = self.runner.lora = LoRAManager.for_engine(config, model, self.pooling, self.device)
        self.speculator = self._speculator(config)
        self.requests: dict[str, Request] = {}
        self._rng = random.Random(config.seed)
        self._seq_ids = itertools.count(1)
        self._pending: list[OutputDelta] = []  # outputs of aborts and timeouts, sent with the next step's
        self.admissions = Admissions()  # requests waiting for their grammar or LoRA adapter
        self.rejected: list[tuple[str, Exception]] = []  # requests refused after add_request (a failed adapter load)
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "requests_finished": 0, "steps": 0}
        log.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB%s); max concurrency at max_model_len=%d: "
                 "%.1f", num_blocks - 1, self.block_size, capacity, self.runner.kv.nbytes / _GiB,
                 f" on rank 0 of {tp.size}" if tp else "", self.max_model_len, capacity / self.max_model_len)

    def _speculator(self, config: EngineConfig):
        spec = config.speculative
        if spec is None:
            return None
        from rtp_llm.spec_decode import Speculator, make_proposer
        from rtp_llm.spec_decode.speculator import DEFAULT_MAX_BATCH

        spec.check_query_limit(self.device.max_decode_query_tokens, self.device.name)
        max_batch = spec.disable_by_batch_size or DEFAULT_MAX_BATCH
        proposer = make_proposer(spec, target=self, max_batch=max_batch)
        log.info("speculative decoding: %s, %d tokens per step%s; no step speculates above %s running decodes",
                 spec.method, spec.num_speculative_tokens,
                 f", n-grams of {spec.prompt_lookup_min or 1}..{spec.prompt_lookup_max} tokens" if spec.model is None
                 else f", draft model {spec.model}", max_batch)
        return Speculator(spec, proposer, self.max_model_len)

    def close(self) -> None:
        """Stops tensor-parallel workers (if any) and leaves the process group. Idempotent."""
        runtime, self.tp_runtime = getattr(self, "tp_runtime", None), None
        if runtime is not None:
            runtime.close()
        for part in (getattr(self, "admissions", None), getattr(self, "lora", None)):
            if part is not None:
                part.close()
        spec, self.speculator = getattr(self, "speculator", None), None
        if spec is not None:
            spec.close()

    # --- requests ----------------------------------------------------------------------------------------------
    @property
    def limits(self) -> InputLimits:
        pooler = self.runner.pooler
        return InputLimits(self.max_model_len, self.vocab_size, self.scheduler.manager.num_blocks - 1,
                           self.block_size, self.config.max_logprobs,
                           pooler.tasks if pooler is not None else ("generate",), self.model_config.hidden_size,
                           tuple(self.model_config.labels))

    def input_processor(self) -> InputProcessor:
        """The processor for requests to this core, sharing its grammar cache (callers on this process)."""
        return InputProcessor(self.tokenizer, self.limits, self.grammars)

    def add_request(self, request: EngineRequest) -> None:
        """Admits a request made by InputProcessor.process (which checked it against self.limits) to the waiting
        queue. Raises RequestRejected when its id is taken or a logprobs count is unresolved, QueueFullError when
        the queue is full."""
        rid, ids, params = request.request_id, request.prompt_token_ids, request.params
        if rid in self.requests:
            raise RequestRejected(f"request id {rid!r} is already in use")
        for name in ("logprobs", "prompt_logprobs"):  # counts the input processor resolved (-1: all), or none
            asked = getattr(params, name)
            if asked is not None and not 0 <= asked <= self.vocab_size:
                raise RequestRejected(f"{name}: {asked} is not a count of tokens in [0, {self.vocab_size}] (pass the "
                                      f"request through InputProcessor.process, which resolves -1)", param=name)
        if len(self.scheduler.waiting) >= self.config.max_queue_len:
            raise QueueFullError(f"the waiting queue is full ({self.config.max_queue_len} requests)")
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        req = Request(rid, list(ids), params, stop_ids, frozenset(params.stop_token_ids) | self.eos_ids,
                      arrival=request.arrival)
        if params.timeout_ms is not None:
            req.deadline = req.arrival + params.timeout_ms / 1000
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        for i in range(params.n):
            req.sequences.append(Sequence(next(self._seq_ids), req, i, base_seed + i,
                                          IncrementalDetokenizer(self.tokenizer, params.stop)))
        waits = []
        if request.lora is not None:  # before the request is registered: a refused adapter leaves nothing behind
            if self.lora is None:
                raise RequestRejected(f"LoRA adapter {request.lora.lora_name!r}: this engine runs without "
                                      f"--enable_lora", param="model")
            req.lora_id, req.lora_key, loading = self.lora.admit(request.lora)
            if loading is not None:  # read on the loader thread meanwhile
                waits.append((LORA, loading))
        self.requests[rid] = req
        if request.pooling is not None:
            req.pooling, req.pool_wanted = request.pooling, self.runner.pooler.rows_wanted()
        so = params.structured_outputs
        if so is not None and not self.grammars.cached(so):  # compiled on a worker thread meanwhile
            waits.append((GRAMMAR, self.admissions.compile(self.grammars.check, so)))
        if waits:
            self.admissions.wait(rid, waits)
        else:
            self._admit(req)

    def unload_lora(self, name: str) -> None:
        if self.lora is not None:
            self.lora.retire(name, {r.lora_id for r in self.requests.values()})

    def _admit(self, req: Request) -> None:
        so = req.params.structured_outputs
        for seq in req.sequences:
            seq.grammar = self.grammars.matcher(so) if so is not None else None
        self.scheduler.add(req.sequences[0])
        for sib in req.sequences[1:]:
            sib.state = SeqState.PENDING_FORK

    def _admit_waiting(self) -> None:
        """Requests whose grammar compiled and whose adapter loaded join the waiting queue; a failed compilation
        fails its request, a failed adapter load refuses its (none of it ran: RequestRejected, as add_request)."""
        idle = not self.scheduler.running and not self.scheduler.waiting
        for rid, failed in self.admissions.ready(idle, self.lora.settle if self.lora is not None else None):
            if rid not in self.requests:
                continue
            if failed is None:
                self._admit(self.requests[rid])
            elif failed[0] == LORA:
                del self.requests[rid]
                self.rejected.append((rid, RequestRejected(str(failed[1]), param="model")))
            else:
                self.abort(rid, FinishReason.ERROR, f"structured outputs: {failed[1]}")

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT, error: Optional[str] = None) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.admissions.discard(request_id)
        for seq in req.sequences:
            if not seq.finished:
                self._finish(seq, reason)
        req.error = error or req.error
        self._pending.append(self.output.request_delta(req, {}))
        self._retire(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # --- the step ----------------------------------------------------------------------------------------------
    def step(self) -> list[OutputDelta]:
        self._expire()
        self._admit_waiting()
        outputs, self._pending = self._pending, []
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.decoding())
        sched = self.scheduler.schedule()
        if self.speculator is not None:
            for seq in sched.preempted:
                self.speculator.release(seq)
        if not sched.scheduled:
            return outputs
        self.counters["steps"] += 1
        self._count_prompt_tokens(sched)
        try:
            t0 = time.perf_counter()
            result = self.runner.execute(sched)
            if self.speculator is not None:
                self.speculator.observe_step(sched, time.perf_counter() - t0)
        except TPWorkerError:
            raise  # the tensor-parallel group is broken: fatal for the engine
        except Exception as exc:  # a failed step fails the requests that cause it, not the engine
            from rtp_llm.engine.step_errors import fail_step

            outputs.extend(fail_step(self, sched, exc))
            outputs.extend(self._pending)
            self._pending = []
            return outputs
        if self.speculator is not None:  # prompts whose prefill completed, before their first token is out
            self.speculator.warm([x.seq for x in sched.scheduled if x.needs_sample and not x.seq.output],
                                 len(self.scheduler.running))
        outputs.extend(self.update_from_output(sched, result))
        outputs.extend(self._pending)
        self._pending = []
        return outputs

    def update_from_output(self, sched: SchedulerOutput, result: RunnerOutput) -> list[OutputDelta]:
        """Forks the siblings that sampled their first token, appends every sampled token, finishes what stopped,
        and returns the touched requests' deltas."""
        if result.pooled is not None:
            return self._pooled(result.pooled)
        self.scheduler.fork_siblings(sched)
        for seq, start, lps in result.prompt_logprobs:
            done = seq.request.prompt_logprobs
            if start <= len(done):  # a recompute after preemption re-reads positions it already has
                done.extend(lps[len(done) - start:])
        deltas: dict[Sequence, StepDelta] = {}
        kept: dict[Sequence, int] = {}  # speculating sequences: the rows whose sample was appended
        ends: dict[Sequence, tuple] = {}  # speculating sequences that stopped: finished once their KV is settled
        ids = result.token_ids
        for i, (seq, _) in enumerate(sched.sample_rows):
            req = seq.request
            j = sched.sample_ahead[i]
            if seq.finished or seq in ends or (j and (kept.get(seq) != j or ids[i - 1] != seq.draft[j - 1])):
                continue  # row j counts only while every draft before it equals the sample of the row before
            if seq.draft:
                kept[seq] = j + 1
            lp = None
            if req.params.logprobs is not None:
                n = req.params.logprobs
                top = list(zip(result.top_ids[i][:n], result.top_logprobs[i][:n])) if result.top_ids else []
                lp = TokenLogprob(ids[i], result.logprobs[i], top)
            try:
                self.counters["generation_tokens"] += 1
                end = self.output.append(seq, ids[i], lp, deltas.setdefault(seq, StepDelta()))
                if end is not None:
                    if seq.draft:
                        ends[seq] = end
                    else:
                        self._finish(seq, *end)
            except Exception as exc:
                log.exception("post-processing failed for request %s", req.request_id)
                self.abort(req.request_id, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
        for x in sched.scheduled:
            if x.draft:
                self._settle(x, kept.get(x.seq, 0))
        for seq, end in ends.items():  # as plain decoding leaves it: KV for every token but the last
            self._finish(seq, *end)
        outputs = []
        for req in {s.request for s in deltas}:
            if req.request_id not in self.requests:
                continue
            outputs.append(self.output.request_delta(req, deltas))
            if req.finished:
                self._retire(req)
        return outputs

    def _pooled(self, pooled: dict) -> list[OutputDelta]:
        """Pooling requests whose prompt completed: their result goes out and their KV blocks back."""
        outputs = []
        for seq, value in pooled.items():
            req = seq.request
            if seq.finished or req.request_id not in self.requests:
                continue
            req.pooled, req.first_token_time = value, time.monotonic()
            self._finish(seq, FinishReason.STOP)
            outputs.append(self.output.request_delta(req, {}))
            self._retire(req)
        return outputs

    def _settle(self, x, rows: int) -> None:
        """A speculating sequence kept `rows` samples (its accepted drafts and the bonus token): the KV of the
        rejected drafts goes back."""
        seq = x.seq
        accepted = max(rows - 1, 0)
        self.speculator.verified(seq, len(x.draft), accepted)
        if seq.finished:  # aborted in the step: its blocks are gone already
            seq.draft = []
            return
        self.scheduler.settle_speculation(seq, x.start + 1 + accepted)

    def _count_prompt_tokens(self, sched: SchedulerOutput) -> None:
        for x in sched.scheduled:
            prompt = len(x.seq.prompt)
            if x.start < prompt:
                n = min(len(x.tokens), prompt - x.start)
                self.counters["prompt_tokens"] += n
                x.seq.request.computed_prompt_tokens += n

    def _expire(self) -> None:
        now = time.monotonic()
        for req in [r for r in self.requests.values() if r.deadline is not None and now > r.deadline]:
            self.abort(req.request_id, FinishReason.ABORT, f"timed out after {req.params.timeout_ms} ms")

    def _finish(self, seq: Sequence, reason: FinishReason, stop_reason=None) -> None:
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
        if seq.request.finished and seq.request.finish_time is None:
            seq.request.finish_time = time.monotonic()

    def _retire(self, req: Request) -> None:
        if self.requests.pop(req.request_id, None) is not None:
            self.counters["requests_finished"] += 1
        if self.lora is not None:  # unloaded adapters no request uses go; the host keeps the others'
            self.lora.sweep({r.lora_id for r in self.requests.values()})

    # --- introspection -----------------------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.scheduler.manager.stats()
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
            **(self.speculator.stats() if self.speculator is not None else {}),
        }
