"""The decoder-only transformer shared by Llama, Qwen2 and Qwen3, and their mixture-of-experts kin.

They differ only in flags of ModelConfig: q/k/v (and o) biases, Qwen3's per-head q_norm/k_norm,
explicit head_dim, tied embeddings, and (MoEConfig) which layers have a sparse MLP (rtp_llm/layers/moe.py).
Q/K/V and gate/up are fused into one matmul each at load time.
The graph runs on a flat ForwardBatch; logits are computed only for batch.logits_indices.

Tensor parallelism (rtp_llm/distributed/): built with a TensorParallel group, the model holds only its
rank's slices (rtp_llm/models/sharding.py) and calls three collectives: an all-reduce after the
vocab-parallel embedding, after o_proj and after down_proj (biases added after the sum), and a gather
of the vocab-parallel logits to rank 0. Without one, the shard is the whole model and nothing changes.
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from rtp_llm.cache.kv_buffer import KVBuffer
from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.attention import AttentionBackend
from rtp_llm.device.forward_batch import ForwardBatch
from rtp_llm.device.torch_ops import TorchOps
from rtp_llm.errors import MissingTensorError, ShapeMismatchError
from rtp_llm.layers.linear import Linear, parameter
from rtp_llm.layers.mlp import GatedMLP
from rtp_llm.layers.moe import SparseMoE
from rtp_llm.layers.norm import RMSNorm
from rtp_llm.layers.rotary import RotaryEmbedding
from rtp_llm.models import moe_weights
from rtp_llm.models.lazy_tensor import LazyTensor, read_tensor
from rtp_llm.models.quantized import QuantizedWeight
from rtp_llm.models.sharding import TPShard

log = logging.getLogger(__name__)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device, shard: TPShard, ops, tp=None, index: int = 0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = shard.num_heads * cfg.head_dim, shard.num_kv_heads * cfg.head_dim
        h, q, kv, eps = cfg.hidden_size, self.q_size, self.kv_size, cfg.rms_norm_eps
        self.ops = ops
        self.input_norm = RMSNorm(h, eps, dtype, device, ops)
        self.qkv = Linear(h, q + 2 * kv, cfg.qkv_bias, dtype, device)
        self.q_norm = RMSNorm(cfg.head_dim, eps, dtype, device, ops) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, eps, dtype, device, ops) if cfg.qk_norm else None
        self.o = Linear(q, h, cfg.o_bias, dtype, device, tp=tp)
        self.post_norm = RMSNorm(h, eps, dtype, device, ops)
        self.moe = cfg.routes(index)  # a sparse MLP: the fused whole-step paths take dense layers only
        self.index = index
        self.observer = None  # DecoderLM.observe: called with this layer's outputs (rtp_llm/tools/compare.py)
        if self.moe:
            self.mlp = SparseMoE(h, cfg.moe, shard.expert_intermediate, shard.shared_intermediate, dtype, device, ops,
                                 tp)
        else:
            self.mlp = GatedMLP(h, shard.intermediate, cfg.mlp_bias, dtype, device, ops, tp)

    # The layer's weights by name: this forward reads them as attributes, a device's fused step (the C++ op names
    # its slots "qkv.packed", "post_norm", ...) looks them up with part(); a new kind of part is named once here.
    NORMS = ("input_norm", "q_norm", "k_norm", "post_norm")
    LINEARS = ("qkv", "o", "gate_up", "down")

    def part(self, name: str) -> Optional[nn.Module]:
        """A norm or linear layer by name; None for a norm the model does not have (q_norm without qk_norm)."""
        if name in ("gate_up", "down"):
            if self.moe:
                raise KeyError(f"a mixture-of-experts layer has no single {name!r}: its experts' are in mlp.experts")
            return getattr(self.mlp, name)
        if name in self.NORMS or name in self.LINEARS:
            return getattr(self, name)
        raise KeyError(f"a decoder layer has no part {name!r} (parts: {self.NORMS + self.LINEARS})")

    def linears(self) -> list[Linear]:
        if self.moe:
            return [self.qkv, self.o] + self.mlp.linears()
        return [self.part(name) for name in self.LINEARS]

    def forward(self, x, residual, cos, sin, layer_kv, attn: AttentionBackend, meta):
        if residual is None:
            residual = x
            h = self.input_norm(x)
        else:
            h, residual = self.input_norm.add(x, residual)
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = q.shape[0]
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotary(q, k, cos, sin)
        x = self.o(attn.forward(q, k, v, layer_kv, meta).reshape(t, self.q_size))
        h, residual = self.post_norm.add(x, residual)
        out = self.mlp(h)
        if self.observer is not None:
            self.observer(f"layers.{self.index}.attention", x)
            self.observer(f"layers.{self.index}.mlp", out)
            self.observer(f"layers.{self.index}.residual", out + residual)  # the stream the next layer takes
        return out, residual


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu", ops=None, tp=None):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.ops = ops or TorchOps()
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.shard = tp.shard(cfg) if self.tp is not None else TPShard.plan(cfg)
        vocab = self.shard.vocab
        self.embed = parameter((vocab, cfg.hidden_size), dtype, device)
        self.embed_quantized: QuantizedWeight | None = None  # the embedding as its file's blocks (then embed is empty)
        self.embed_rows = None  # prepare(): ids -> rows of embed_quantized, as the op set looks them up
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, device, self.shard, self.ops, self.tp, i)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device, self.ops)
        # A pooling checkpoint (rtp_llm/pooling/) has no LM head: a base model none, a classifier its `score`
        # matrix (num_labels x hidden), applied to a pooled row in float32.
        self.head = Linear(cfg.hidden_size, vocab, False, dtype, device,
                           tied=self.embed if cfg.tie_word_embeddings else None) if cfg.head == "lm" else None
        self.score = parameter((cfg.num_labels, cfg.hidden_size), dtype, device) if cfg.head == "score" else None
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, min(cfg.max_position_embeddings, 4096), device)
        self.fused_layers = None  # prepare(): the op set's whole-step path, if it has one
        self.lora_ctx = None  # rtp_llm/lora: set when adapters are enabled (the fused layers add their deltas)
        self.observer = None  # observe(): a step being observed runs unfused, each layer reporting its outputs

    def prepare(self) -> None:
        """After the weights are loaded: the device picks (and packs for) each linear layer's kernel, and the row
        lookup of an embedding kept as blocks."""
        for layer in self.layers:  # before the linears: a device may take the experts into its own layout
            if layer.moe:
                self.ops.prepare_moe(layer.mlp)
        self.ops.prepare_linears([lin for layer in self.layers for lin in layer.linears()], self.head)
        if self.embed_quantized is not None:
            tied = self.head if self.head is not None and self.head.tied else None
            self.embed_rows = self.ops.quantized_embedding(self.embed_quantized, tied,
                                                           self.embed)
        dense = not any(layer.moe for layer in self.layers)
        self.fused_layers = self.ops.fused_layers(self.layers, self.cfg) if dense else None

    # --- weights -------------------------------------------------------------------------------------
    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        """Every Hugging Face tensor name this model reads, with its shape."""
        c = self.cfg
        h, q, kv, inter, d = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size, c.head_dim
        out = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
        if c.head == "lm" and not c.tie_word_embeddings:
            out["lm_head.weight"] = (c.vocab_size, h)
        if c.head == "score":
            out["score.weight"] = (c.num_labels, h)
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            out.update({
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
            })
            if c.routes(i):
                out.update(moe_weights.expected_weights(c, i))
            else:
                out.update({p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                            p + "mlp.down_proj.weight": (h, inter)})
            if c.qkv_bias:
                out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                            p + "self_attn.v_proj.bias": (kv,)})
            if c.o_bias:
                out[p + "self_attn.o_proj.bias"] = (h,)
            if c.qk_norm:
                out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
            if c.mlp_bias and not c.routes(i):
                out.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                            p + "mlp.down_proj.bias": (h,)})
        return out

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | LazyTensor]], progress: bool = False,
                     int8: bool = False) -> None:
        """Copies checkpoint tensors in (any order), checking names and full shapes first. Under tensor
        parallelism only this rank's slice of each tensor is read (lazily, for safetensors). int8: each linear layer
        (and an untied LM head) keeps per-output-channel int8 made from its float weight where the op set
        multiplies that form (QuantizedWeight.per_channel_int8)."""
        self._int8 = int8
        expected = self.expected_weights()
        slices = self.shard.weight_slices(self.cfg)
        got: dict[str, torch.Tensor] = {}
        it = moe_weights.canonical_names(weights) if self.cfg.moe is not None else weights
        if self.cfg.head == "none":  # a base model saved on its own (Qwen3Model...) names its tensors without "model."
            it = ((n if n.startswith("model.") else "model." + n, t) for n, t in it)
        if progress:
            from tqdm import tqdm
            it = tqdm(it, total=len(expected), desc="Loading weights", unit="tensor")
        for name, tensor in it:
            if name not in expected:
                continue  # e.g. rotary inv_freq buffers, or a tied lm_head copy
            if tuple(tensor.shape) != expected[name]:
                raise ShapeMismatchError(
                    f"tensor {name} has shape {tuple(tensor.shape)}, but the config implies {expected[name]}")
            if isinstance(tensor, QuantizedWeight):
                piece = slices.get(name)
                shard = tensor if piece is None else tensor.narrow(*piece)  # whole blocks of this rank's slice
                if self._runs_quantized(tensor) and shard is not None:
                    got[name] = shard
                    continue
                tensor = tensor.dequantize()
            got[name] = read_tensor(tensor, slices.get(name)).to(self.dtype)
        missing = [n for n in expected if n not in got]
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise MissingTensorError(f"checkpoint is missing tensor {', '.join(missing[:3])}{more}")
        embed = got["model.embed_tokens.weight"]
        if isinstance(embed, QuantizedWeight):
            self.embed_quantized = embed
            self.embed.data = torch.empty(0, dtype=self.dtype, device=self.embed.device)
            if self.head is not None and self.head.tied:
                self.head.quantized = embed
        else:
            self.embed.copy_(embed)
        self.norm.weight.copy_(got["model.norm.weight"])
        if self.head is not None and not self.head.tied:
            self._load_linear(self.head, [got["lm_head.weight"]])
        if self.score is not None:
            self.score.copy_(got["score.weight"])
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.input_norm.weight.copy_(got[p + "input_layernorm.weight"])
            layer.post_norm.weight.copy_(got[p + "post_attention_layernorm.weight"])
            self._load_linear(layer.qkv, [got[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            if layer.qkv.bias is not None:
                layer.qkv.bias.copy_(torch.cat([got[p + f"self_attn.{x}_proj.bias"] for x in "qkv"]))
            if layer.q_norm is not None:
                layer.q_norm.weight.copy_(got[p + "self_attn.q_norm.weight"])
                layer.k_norm.weight.copy_(got[p + "self_attn.k_norm.weight"])
            self._load_linear(layer.o, [got[p + "self_attn.o_proj.weight"]])
            if layer.o.bias is not None:
                layer.o.bias.copy_(got[p + "self_attn.o_proj.bias"])
            mlp = layer.mlp
            if layer.moe:
                moe_weights.load_layer(self._load_linear, mlp, got, i)
                continue
            self._load_linear(mlp.gate_up, [got[p + "mlp.gate_proj.weight"], got[p + "mlp.up_proj.weight"]])
            self._load_linear(mlp.down, [got[p + "mlp.down_proj.weight"]])
            if mlp.gate_up.bias is not None:
                mlp.gate_up.bias.copy_(torch.cat([got[p + "mlp.gate_proj.bias"], got[p + "mlp.up_proj.bias"]]))
                mlp.down.bias.copy_(got[p + "mlp.down_proj.bias"])
        self._log_weight_formats()

    def _runs_quantized(self, w: QuantizedWeight) -> bool:
        return self.ops.runs_quantized(w.format, self.dtype)

    def _load_linear(self, lin: Linear, parts: list) -> None:
        """A linear layer's weight from its checkpoint tensors (row-concatenated): kept as blocks when they all are
        in one format, else dense (or, with int8, per-channel int8 made from the dense rows)."""
        if all(isinstance(t, QuantizedWeight) for t in parts):
            q = QuantizedWeight.cat(parts)
            if q is not None:
                self._keep_quantized(lin, q)
                return
        dense = torch.cat([t.dequantize().to(self.dtype) if isinstance(t, QuantizedWeight) else t for t in parts])
        if getattr(self, "_int8", False) and self.ops.multiplies_quantized("Q8_0", self.dtype):
            q = QuantizedWeight.per_channel_int8(dense)
            if q is not None:
                self._keep_quantized(lin, q)
                return
        lin.weight.copy_(dense)

    def _keep_quantized(self, lin: Linear, q: QuantizedWeight) -> None:
        lin.quantized = q
        lin.weight.data = torch.empty(0, dtype=self.dtype, device=lin.weight.device)

    def _log_weight_formats(self) -> None:
        """One line: which format each class of tensor runs in, and the bytes the weights keep resident."""
        classes: dict[str, set[str]] = {}
        resident = 0
        named = [("embedding", self.embed_quantized, self.embed)]
        if self.head is not None and not self.head.tied:
            named.append(("lm_head", self.head.quantized, self.head.weight))
        for layer in self.layers:
            named += [("attention", lin.quantized, lin.weight) for lin in (layer.qkv, layer.o)]
            named += [("experts" if layer.moe else "mlp", lin.quantized, lin.weight) for lin in layer.linears()[2:]]
        for cls, q, w in named:
            classes.setdefault(cls, set()).add(q.format if q is not None else str(w.dtype).replace("torch.", ""))
            resident += q.nbytes if q is not None else w.numel() * w.element_size()
        if self.head is not None and self.head.tied:
            classes["lm_head"] = {"tied to the embedding"}
        log.info("weights: %s; %.1f MB resident (linear layers and embedding)",
                 ", ".join(f"{c} {'/'.join(sorted(f))}" for c, f in classes.items()), resident / 1e6)

    # --- forward -------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv: KVBuffer, attn: AttentionBackend) -> torch.Tensor:
        """The final norm's hidden states of the rows that need logits ([len(batch.logits_indices), hidden]); the
        model runner turns them into logits (compute_logits) or greedy tokens (greedy_token_ids)."""
        meta = attn.prepare(batch)
        cos, sin = self.rotary.cos_sin(batch.positions, self.dtype, max(batch.kv_lens) - 1)
        x = self._embed(batch.input_ids)
        residual = None
        if self.observer is not None:
            self.observer("embedding", x)
        if self.fused_layers is not None and self.observer is None and self.fused_layers.runs(meta):
            x, residual = self.fused_layers(x, cos, sin, kv, meta, attn.scale, self.lora_ctx)
        else:
            for i, layer in enumerate(self.layers):
                x, residual = layer(x, residual, cos, sin, kv.layer(i), attn, meta)
        # The rows that need logits: every row in a decode step (no gather then), else an index_select (torch's
        # advanced indexing wakes its OpenMP team). The sum and the norm in one op (add_rms_norm rounds the sum as
        # x + residual does).
        idx = batch.logits_indices
        if idx.numel() != x.shape[0]:
            x, residual = x.index_select(0, idx), residual.index_select(0, idx)
        h = self.norm.add(x, residual)[0]
        if self.observer is not None:
            self.observer("norm", h)
        return h

    def observe(self, observer) -> None:
        """observer(name, tensor) gets every forward's outputs in model order: embedding, then per layer
        layers.N.attention (after o_proj), layers.N.mlp, layers.N.residual (the hidden state the next layer takes),
        then norm (the rows that need logits), and from the model runner the logits it computes from them (under
        tensor parallelism after their gather, which every rank joins); None stops. Unobserved, a forward pays one
        branch per layer."""
        self.observer = observer
        for layer in self.layers:
            layer.observer = observer

    @property
    def has_greedy_head(self) -> bool:
        """Whether greedy_token_ids can skip the logits (the whole vocabulary is on this rank)."""
        return self.tp is None

    @torch.no_grad()
    def greedy_token_ids(self, h: torch.Tensor) -> torch.Tensor:
        """Each row's argmax over the vocabulary ([R] int64), without materialising the logits where the device's
        head can; the same ids as compute_logits(h).argmax(-1)."""
        if not self.has_greedy_head:
            raise RuntimeError("greedy_token_ids needs the whole vocabulary on this rank (no tensor parallelism)")
        return self.ops.greedy_tokens(h, self.head)

    @torch.no_grad()
    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits [R, vocab] of forward's hidden states (gathered across tensor-parallel ranks)."""
        if self.tp is None:
            return self.head(h).float()
        if h.shape[0] == 0:  # every rank knows: the sampled rows are part of the step message
            return h.new_empty((0, self.cfg.vocab_size), dtype=torch.float32)
        return self.tp.gather_vocab(self.head(h).float(), self.shard, self.cfg.vocab_size)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_quantized is not None:
            return self.embed_rows(ids)
        return F.embedding(ids, self.embed)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return self._lookup(ids)
        # Vocab-parallel: each rank looks up the ids in its rows, zeros the rest; the sum is exact.
        local = ids - self.shard.vocab_start
        outside = (local < 0) | (local >= self.shard.vocab)
        x = self._lookup(local.masked_fill(outside, 0))
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(x)
