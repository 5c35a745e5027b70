"""The fused-op set the model graph and the sampler call. TorchOps is plain torch (CPU, CUDA and the
reference); a device may supply its own (rtp_llm/device/npu_ops.py) with the same math."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rtp_llm.layers.norm import rms_norm
from rtp_llm.layers.rotary import apply_rotary
from rtp_llm.sampling.top_k_top_p import apply_top_k_top_p


class TorchOps:
    name = "torch"

    def prepare(self, model) -> None:
        """Called once after the weights are loaded; a device may repack them (CpuOps: oneDNN layouts)."""

    def zeros_buffer(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """A large, long-lived zeroed buffer (the KV cache); a device may place it specially (CPU: huge pages)."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        """(rms_norm(x + residual), x + residual)."""
        s = x + residual
        return rms_norm(s, weight, eps), s

    def rotary(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [T, H, D], k [T, KVH, D]; cos/sin [T, D] (rotate-half)."""
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def lm_head(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Logits of the few sampled rows. [V, H] @ [H, R] streams the large vocabulary matrix once,
        measurably faster on CPU than F.linear's [R, H] @ [H, V] (about 1.3x at R=32, V=49152)."""
        return (weight @ h.t()).t()

    def greedy_tokens(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """argmax of lm_head(h, weight) per row (ties: the lowest id), for steps whose sampled rows are all
        greedy with nothing that reshapes their logits. A device may find it without every logit."""
        return self.lm_head(h, weight).float().argmax(dim=-1)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def mlp(self, h: torch.Tensor, gate_up_weight, gate_up_bias, down_weight, down_bias) -> torch.Tensor:
        """The gated MLP: down(silu(gate) * up). One op so that a device may run it in pieces."""
        return self.linear(self.silu_and_mul(self.linear(h, gate_up_weight, gate_up_bias)), down_weight, down_bias)

    def decode_layers(self, model, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv, attn, meta):
        """All decoder layers of a step in one call: (x, residual) after the last layer, or None where this
        op set has no such path for the step (the model then runs its layers one by one)."""
        return None

    def top_k_top_p(self, logits: torch.Tensor, k, p) -> torch.Tensor:
        return apply_top_k_top_p(logits, k, p)
