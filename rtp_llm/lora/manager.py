"""LoRAManager: the adapters an engine knows (loaded from disk once, kept on the host up to max_cpu_loras, least
recently used first out) and the ones resident in the base layers' slots (up to max_loras; a step never needs more:
the scheduler admits no request whose adapter would make a step's count exceed it). The runner tells it each step's
rows per adapter."""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch

from rtp_llm.errors import RequestRejected
from rtp_llm.lora.adapter import MODULES, LoRAAdapter, LoRAError, LoRARequest
from rtp_llm.lora.layers import LinearLoRA, LoRAContext

log = logging.getLogger(__name__)

_FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
          "down": ("down_proj",)}


class LoRAManager:
    def __init__(self, model, max_loras: int = 1, max_lora_rank: int = 16, max_cpu_loras: Optional[int] = None):
        if any(layer.moe for layer in model.layers):
            raise ValueError("LoRA adapters apply to dense models (attention and gated MLP projections) for now")
        self.model, self.cfg = model, model.cfg
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.ctx = LoRAContext()
        self.device = model.embed.device
        shard, d = model.shard, self.cfg.head_dim  # this rank's heads and MLP columns under tensor parallelism
        q, kv, inter = shard.num_heads * d, shard.num_kv_heads * d, shard.intermediate
        # A and B sharded like the base: column-parallel layers take B's rows of their outputs, row-parallel ones
        # A's columns of their inputs (their partial deltas join the base's partial sums in one all-reduce)
        self.slices = shard.weight_slices(self.cfg)
        mc = self.cfg
        offsets = {"qkv": [0, q, q + kv], "o": [0], "gate_up": [0, inter], "down": [0]}
        outs = {"qkv": q + 2 * kv, "o": mc.hidden_size, "gate_up": 2 * inter, "down": mc.hidden_size}
        self.layers = []  # per decoder layer: fused name -> LinearLoRA
        for layer in model.layers:
            per = {}
            for fused, mods in _FUSED.items():
                lin = layer.part(fused)
                lin.lora = per[fused] = LinearLoRA(self.ctx, offsets[fused], outs[fused], model.ops)
            self.layers.append(per)
        model.lora_ctx = self.ctx
        self.known: dict[str, LoRARequest] = {}           # name -> request
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # loaded adapters, LRU order
        self.slots: OrderedDict[int, int] = OrderedDict()  # lora id -> slot, LRU order
        self.retiring: set[str] = set()  # unloaded while requests still ran with them
        self.loads = 0  # adapters added so far: each load's prefix-cache key (a reused id must not hit the old KV)
        self.cache_keys: dict[int, int] = {}
        self.told: dict[int, tuple[str, str]] = {}  # tensor parallelism: what the other ranks know of each id
        self.loading: dict[tuple[int, str], Future] = {}  # (id, path) -> its load on the loader thread
        self.in_use: set[int] = set()  # ids the engine's requests run with (admit adds, sweep resets)
        self._pool: Optional[ThreadPoolExecutor] = None  # the loader thread, started at the first read

    @classmethod
    def for_engine(cls, config, model, pooling: bool, device) -> Optional["LoRAManager"]:
        """The engine's manager (None without enable_lora), with the adapters of config.lora_modules loaded."""
        if not config.enable_lora:
            if config.lora_modules:
                raise ValueError("lora_modules needs enable_lora")
            return None
        if pooling or (config.speculative is not None and config.speculative.method == "draft_model"):
            raise ValueError("LoRA adapters run on the generate runner, without a draft model")
        if not device.runs_lora:
            raise ValueError(f"LoRA adapters run on the CPU for now, not on {device.name}")
        manager = cls(model, config.max_loras, config.max_lora_rank, config.max_cpu_loras)
        for i, (name, path) in enumerate((config.lora_modules or {}).items(), start=1):
            manager.add(LoRARequest(name, i, path))
        log.info("LoRA: %d adapters loaded (%s); at most %d per step, rank <= %d", len(manager.known),
                 ", ".join(manager.known) or "none yet", config.max_loras, config.max_lora_rank)
        return manager

    # --- adapters ----------------------------------------------------------------------------------------------
    def admit(self, request: LoRARequest) -> tuple[int, int, Optional[Future]]:
        """A request's adapter: its id, its prefix-cache key and, when it is not on the host yet, the Future of its
        load on the loader thread (the step loop goes on meanwhile; the core admits the request once settle() has
        taken the adapter in, and refuses it if the load failed). A name or id another adapter holds is
        RequestRejected at once."""
        try:
            self._check(request)
        except LoRAError as exc:
            raise RequestRejected(str(exc), param="model") from None
        self._register(request)
        self.in_use.add(request.lora_int_id)
        future = self._load(request) if request.lora_int_id not in self.host else None
        return request.lora_int_id, self.cache_keys[request.lora_int_id], future

    def _load(self, request: LoRARequest) -> Future:
        """The adapter's read on the loader thread (started now, or the one already under way)."""
        key = (request.lora_int_id, request.lora_path)
        future = self.loading.get(key)
        if future is None or (future.done() and future.exception() is not None):  # none, or a failed one: again
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="lora-load")
            future = self.loading[key] = self._pool.submit(self._read, request)
        return future

    def settle(self) -> None:
        """Finished loads: each adapter to the host, or (a failed load) its name forgotten."""
        for (lora_id, path), future in list(self.loading.items()):
            if not future.done():
                continue
            del self.loading[(lora_id, path)]
            request = next((r for r in self.known.values() if (r.lora_int_id, r.lora_path) == (lora_id, path)), None)
            if request is None:  # unloaded meanwhile
                continue
            if future.exception() is not None:
                self.remove(request.lora_name)
                self.told.pop(lora_id, None)  # the other ranks' reads failed too: tell them again if it comes back
            else:
                self._store(request, future.result())

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Loads (and checks) an adapter now; LoRAError names what is wrong with it. Re-adding a known name with the
        same id and path is a no-op."""
        self._check(request)
        adapter = self._host(request)
        self._register(request)
        return adapter

    def _register(self, request: LoRARequest) -> None:
        if request.lora_name not in self.known:
            self.loads += 1
            self.cache_keys[request.lora_int_id] = self.loads
        self.known[request.lora_name] = request

    def _check(self, request: LoRARequest) -> None:
        old = self.known.get(request.lora_name)
        if old is not None and (old.lora_int_id, old.lora_path) != (request.lora_int_id, request.lora_path):
            raise LoRAError(f"LoRA adapter {request.lora_name!r} is already loaded (from {old.lora_path}); unload it "
                            f"first")
        if any(r.lora_int_id == request.lora_int_id and r.lora_name != request.lora_name
               for r in self.known.values()):
            raise LoRAError(f"lora_int_id {request.lora_int_id} is taken by another adapter")

    def retire(self, name: str, in_use: set) -> None:
        """Removes the adapter now, or once no request in `in_use` (lora ids) runs with it (sweep)."""
        request = self.known.get(name)
        if request is None:
            return
        if request.lora_int_id in in_use:
            self.retiring.add(name)
        else:
            self.remove(name)

    def sweep(self, in_use: set) -> None:
        """After a request left: in_use, the ids the engine's requests still run with. Unloaded adapters none of
        them uses go; the host keeps the others' weights (so no request's adapter is read again on the loop) and
        trims back to max_cpu_loras among the rest."""
        self.in_use = set(in_use)
        for name in [n for n in self.retiring if self.known[n].lora_int_id not in in_use]:
            self.remove(name)
        self._trim(None)

    def remove(self, name: str) -> None:
        self.retiring.discard(name)
        request = self.known.pop(name, None)
        if request is None:
            raise LoRAError(f"no LoRA adapter named {name!r} is loaded")
        self.host.pop(request.lora_int_id, None)
        self.cache_keys.pop(request.lora_int_id, None)
        slot = self.slots.pop(request.lora_int_id, None)
        if slot is not None:
            for per in self.layers:
                for lin in per.values():
                    lin.remove(slot)

    def _host(self, request: LoRARequest) -> LoRAAdapter:
        adapter = self.host.get(request.lora_int_id)
        if adapter is None:  # first use (its read under way: wait for it), or evicted from the host: read now
            future = self.loading.pop((request.lora_int_id, request.lora_path), None)
            adapter = self._store(request, future.result() if future is not None else self._read(request))
        self.host.move_to_end(request.lora_int_id)
        return adapter

    def _read(self, request: LoRARequest) -> LoRAAdapter:
        """Reads, checks and packs an adapter (the loader thread or the loop): no state of the manager changes."""
        adapter = LoRAAdapter.load(request, self.cfg, self.max_lora_rank)
        # packed once for every layer (this rank's shard): making an adapter resident only places it
        adapter.packed = [{fused: per[fused].pack([self._shard(i, m, adapter.weights.get((i, m))) for m in mods])
                           for fused, mods in _FUSED.items()} for i, per in enumerate(self.layers)]
        adapter.weights = {}  # the packed copy is the one kept
        return adapter

    def _store(self, request: LoRARequest, adapter: LoRAAdapter) -> LoRAAdapter:
        self.host[request.lora_int_id] = adapter
        self._trim(request.lora_int_id)
        return adapter

    def _trim(self, keep: Optional[int]) -> None:
        """Down to max_cpu_loras on the host: the least recently used first, never a resident, one a request runs
        with, or `keep`."""
        while len(self.host) > self.max_cpu_loras:
            victim = next((i for i in self.host if i not in self.slots and i not in self.in_use and i != keep), None)
            if victim is None:
                break
            del self.host[victim]

    # --- the step ----------------------------------------------------------------------------------------------
    def set_step(self, rows_of: dict[int, list[int]]) -> None:
        """rows_of: lora id -> the step's flat-batch rows of that adapter. Makes each resident (evicting the least
        recently used others) and groups the rows by slot."""
        if len(rows_of) > self.max_loras:
            raise RuntimeError(f"a step with {len(rows_of)} adapters exceeds max_loras={self.max_loras}")
        groups = []
        for lora_id, rows in rows_of.items():
            slot = self._resident(lora_id)
            groups.append((slot, torch.tensor(rows, dtype=torch.long).to(self.device)))
        self.ctx.groups = groups

    def clear_step(self) -> None:
        self.ctx.groups = []

    def _resident(self, lora_id: int) -> int:
        slot = self.slots.get(lora_id)
        if slot is not None:
            self.slots.move_to_end(lora_id)
            return slot
        request = next(r for r in self.known.values() if r.lora_int_id == lora_id)
        adapter = self._host(request)
        if len(self.slots) >= self.max_loras:
            _, slot = self.slots.popitem(last=False)
        else:
            slot = len(self.slots)
        for per, packed in zip(self.layers, adapter.packed):
            for fused in _FUSED:
                per[fused].install(slot, packed[fused], self.device)
        self.slots[lora_id] = slot
        return slot

    def _shard(self, layer: int, module: str, w):
        if w is None or not self.slices:
            return w
        a, b, scale = w
        room = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        dim, start, stop = self.slices[f"model.layers.{layer}.{room}.{module}.weight"]
        return (a, b[start:stop], scale) if dim == 0 else (a[:, start:stop], b, scale)

    # --- tensor parallelism: rank 0 tells the other ranks which adapter each id is --------------------------------
    def untold(self, ids) -> list[tuple[int, str, str]]:
        """(id, name, path) of the adapters the other ranks do not know yet (or know as another): this step's, and
        those rank 0 is reading now, so that the other ranks read theirs meanwhile."""
        out = []
        for lora_id in dict.fromkeys([i for i in ids if i] + [i for i, _ in self.loading]):
            request = next((r for r in self.known.values() if r.lora_int_id == lora_id), None)
            if request is not None and self.told.get(lora_id) != (request.lora_name, request.lora_path):
                self.told[lora_id] = (request.lora_name, request.lora_path)
                out.append((lora_id, request.lora_name, request.lora_path))
        return out

    def learn(self, adapters) -> None:
        """A rank > 0: adapters rank 0 has admitted, each replacing whatever this rank knew by that id or name, and
        read on this rank's loader thread (the first step that uses one waits for it, if it must)."""
        for lora_id, name, path in adapters:
            for old in [r.lora_name for r in self.known.values() if r.lora_int_id == lora_id or r.lora_name == name]:
                self.remove(old)
            request = LoRARequest(name, lora_id, path)
            self._register(request)
            self._load(request)

    def id_of(self, name: str) -> Optional[int]:
        r = self.known.get(name)
        return None if r is None else r.lora_int_id


assert set(m for mods in _FUSED.values() for m in mods) == set(MODULES)
