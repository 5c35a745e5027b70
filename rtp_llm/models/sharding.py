"""Which slice of each weight a tensor-parallel rank holds (Megatron-style).

- Attention: each rank owns a contiguous range of KV heads and the query heads of those groups, so
  every rank runs ordinary GQA on its slice (the same attention kernels as TP=1). With fewer KV heads
  than ranks, each KV head is replicated on tp/kv ranks and its query group is split between them.
  Head counts need not divide evenly: SmolLM2's 9 query / 3 KV heads over 2 ranks become 6/2 and 3/1
  (vLLM would refuse; we accept the imbalance in the attention projections, the MLP still splits evenly).
- MLP: gate/up column-parallel, down row-parallel over an even split of intermediate_size; in a
  mixture-of-experts block every expert (and the shared expert) is split the same way over its own intermediate
  size, and the router is replicated.
- Vocabulary: embedding and LM head are vocab-parallel in chunks of ceil(V / tp) rows.
- o_proj and down_proj are row-parallel: each rank's partial sum is all-reduced, bias added after.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.errors import ShardingError


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` when n items are split as evenly as possible (larger parts first)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(frozen=True)
class TPShard:
    rank: int
    size: int
    head_start: int
    head_stop: int
    kv_start: int
    kv_stop: int
    inter_start: int
    inter_stop: int
    vocab_start: int
    vocab_stop: int
    vocab_chunk: int  # every rank's logits are padded to this width for the gather
    expert_inter_start: int = 0
    expert_inter_stop: int = 0
    shared_inter_start: int = 0
    shared_inter_stop: int = 0

    @property
    def num_heads(self) -> int:
        return self.head_stop - self.head_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_stop - self.kv_start

    @property
    def intermediate(self) -> int:
        return self.inter_stop - self.inter_start

    @property
    def expert_intermediate(self) -> int:
        return self.expert_inter_stop - self.expert_inter_start

    @property
    def shared_intermediate(self) -> int:
        return self.shared_inter_stop - self.shared_inter_start

    @property
    def vocab(self) -> int:
        return self.vocab_stop - self.vocab_start

    @classmethod
    def plan(cls, cfg: ModelConfig, size: int = 1, rank: int = 0) -> "TPShard":
        if size < 1 or not 0 <= rank < size:
            raise ShardingError(f"bad tensor-parallel rank {rank} of {size}")
        heads, kv = cfg.num_heads, cfg.num_kv_heads
        group = heads // kv
        if kv >= size:
            kv_start, kv_stop = split_range(kv, size, rank)
            head_start, head_stop = kv_start * group, kv_stop * group
        else:
            if size % kv:
                raise ShardingError(
                    f"tp_size={size} is larger than num_key_value_heads={kv} and not a multiple of it; "
                    f"use a tp_size of at most {kv} or a multiple of {kv}")
            replicas = size // kv
            if group < replicas:
                raise ShardingError(f"tp_size={size} exceeds the number of attention heads ({heads})")
            kv_start = rank // replicas
            kv_stop = kv_start + 1
            lo, hi = split_range(group, replicas, rank % replicas)
            head_start, head_stop = kv_start * group + lo, kv_start * group + hi
        if cfg.intermediate_size < size:
            raise ShardingError(f"tp_size={size} exceeds intermediate_size={cfg.intermediate_size}")
        inter_start, inter_stop = split_range(cfg.intermediate_size, size, rank)
        experts = shared = (0, 0)
        if cfg.moe is not None:
            for name, n in (("moe_intermediate_size", cfg.moe.intermediate_size),
                            ("shared_expert_intermediate_size", cfg.moe.shared_intermediate_size or size)):
                if n < size:
                    raise ShardingError(f"tp_size={size} exceeds {name}={n}")
            experts = split_range(cfg.moe.intermediate_size, size, rank)
            shared = split_range(cfg.moe.shared_intermediate_size, size, rank)
        chunk = -(-cfg.vocab_size // size)
        vocab_start, vocab_stop = min(rank * chunk, cfg.vocab_size), min((rank + 1) * chunk, cfg.vocab_size)
        if vocab_stop <= vocab_start:
            raise ShardingError(f"tp_size={size} is too large for vocab_size={cfg.vocab_size}")
        return cls(rank, size, head_start, head_stop, kv_start, kv_stop, inter_start, inter_stop,
                   vocab_start, vocab_stop, chunk, *experts, *shared)

    def weight_slices(self, cfg: ModelConfig) -> dict[str, tuple[int, int, int]]:
        """Hugging Face tensor name -> (dim, start, stop) this rank reads; names not listed are replicated."""
        if self.size == 1:
            return {}
        d = cfg.head_dim
        q = (0, self.head_start * d, self.head_stop * d)
        kv = (0, self.kv_start * d, self.kv_stop * d)
        inter = (self.inter_start, self.inter_stop)
        out = {"model.embed_tokens.weight": (0, self.vocab_start, self.vocab_stop)}
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (0, self.vocab_start, self.vocab_stop)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            out[p + "self_attn.q_proj.weight"] = q
            out[p + "self_attn.q_proj.bias"] = q
            for x in "kv":
                out[p + f"self_attn.{x}_proj.weight"] = kv
                out[p + f"self_attn.{x}_proj.bias"] = kv
            out[p + "self_attn.o_proj.weight"] = (1, q[1], q[2])
            for x in ("gate", "up"):
                out[p + f"mlp.{x}_proj.weight"] = (0, *inter)
                out[p + f"mlp.{x}_proj.bias"] = (0, *inter)
            out[p + "mlp.down_proj.weight"] = (1, *inter)
            if cfg.routes(i):
                ranges = [(f"mlp.experts.{e}.", (self.expert_inter_start, self.expert_inter_stop))
                          for e in range(cfg.moe.num_experts)]
                ranges.append(("mlp.shared_expert.", (self.shared_inter_start, self.shared_inter_stop)))
                for prefix, rows in ranges:
                    out[p + prefix + "gate_proj.weight"] = out[p + prefix + "up_proj.weight"] = (0, *rows)
                    out[p + prefix + "down_proj.weight"] = (1, *rows)
        return out
