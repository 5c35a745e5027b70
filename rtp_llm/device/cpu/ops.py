"""The CPU's op set: TorchOps, with the C++ kernels of rtp_llm/_ops.so (rtp_llm/cpp/cpu/) where they apply:
- linear layers and the LM head on the kernels device/cpu/linear.py chooses once per weight;
- greedy steps of a float32 head on panels: the argmax through an exact bf16 screen (greedy_head.cc); of other
  heads (bf16, GGUF as stored): every logit, then the argmax in one vectorised pass (argmax_rows.cc);
- RMSNorm, residual add + RMSNorm and RoPE as one op each instead of 6-12 aten ops, whose dispatch dominates them
  at decode batch sizes; the SiLU-gated activation in one pass (or inside gate_up's kernel: gated panels);
- a prefill's MLP in row pieces, so that each piece's gate_up output stays in cache;
- every decoder layer of a step whose rows all take one attention kernel in one C++ call, a prefill's rows in
  pieces that stay in cache (device/cpu/fused_layers.py);
- top-k/top-p: the C++ twin of the NPU operator, bit-identical masks without sorting the vocabulary.
Each kernel rounds where the reference does (float32 and bfloat16); tests/device/cpu holds them to TorchOps.
"""

from __future__ import annotations

import os

import torch

from rtp_llm.device.cpu.fused_layers import FusedDecoderLayers
from rtp_llm.device.cpu.linear import LinearPlanner
from rtp_llm.device.torch_ops import TorchOps


def available_memory() -> int:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


GGUF_BLOCKS = ("auto", "on", "off")


class CpuOps(TorchOps):
    name = "cpu"
    # The fused norm / RoPE / activation kernels: float32 math, bf16 rounded where the reference rounds.
    FUSED_DTYPES = (torch.float32, torch.bfloat16)
    # Rows per piece of a prefill's MLP (mlp()); benchmarks/ARCHIVE.md has the measurement.
    MLP_ROWS = 512
    # torch.ops.rtp_llm.quant_linear's formats (rtp_llm/cpp/cpu/quant_blocks.h); float32 math, bf16 activations
    # widened to it and the result rounded once.
    quantized_formats = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
    quantized_dtypes = (torch.float32, torch.bfloat16)
    # Rows from which a head of GGUF blocks finds greedy tokens through the bf16 screen (quant_greedy_head): below,
    # quant_linear's few-row path computes every logit faster (benchmarks.cpu_greedy_head --quant).
    QUANT_SCREEN_MIN_ROWS = 5

    def __init__(self, gemv_weights: str = "auto", available_memory=available_memory, gguf_blocks: str = "auto"):
        """gguf_blocks: keep GGUF matrices as stored under quantization "auto": on, off, or auto = where the block
        kernels run (AVX-512 or AVX2: at the float32 panels' speed or faster, from a fraction of their memory)."""
        from rtp_llm._native import ops

        self.kernels = ops()
        if gguf_blocks not in GGUF_BLOCKS:
            raise ValueError(f"cpu_gguf_blocks must be one of {', '.join(GGUF_BLOCKS)}, got {gguf_blocks!r}")
        self.keep_blocks = self.kernels.cpu_isa() != "scalar" if gguf_blocks == "auto" else gguf_blocks == "on"
        self.planner = LinearPlanner(self.kernels, gemv_weights, available_memory)
        self.panel_dtypes = self.planner.panel_dtypes
        self.gated_dtypes = self.planner.gated_dtypes  # gate_up packed as gated panels (the SiLU in its epilogue)
        # Greedy steps screen the vocabulary with a bf16 copy of the LM head (greedy_tokens); read at prepare.
        self.greedy_screen = True

    def runs_quantized(self, fmt: str, dtype: torch.dtype) -> bool:
        return self.keep_blocks and self.multiplies_quantized(fmt, dtype)

    @property
    def keeps_plain_weights(self) -> bool:
        return self.planner.keeps_plain_weights

    def prepare_linears(self, linears, head) -> None:
        self.planner.assign(linears, head, self.greedy_screen)

    def fused_layers(self, layers, cfg):
        return FusedDecoderLayers(self.kernels, layers, cfg, self.MLP_ROWS)

    def greedy_tokens(self, h, head):
        screen = getattr(head.kernel, "screen", None)
        packed_head = screen is not None and screen[0] is None
        if packed_head and h.shape[0] < self.QUANT_SCREEN_MIN_ROWS:
            screen = None  # a few rows' logits decode the blocks in registers: faster than the screen's panels
        if screen is not None and h.dtype == torch.float32 and h.dim() == 2:
            if packed_head:  # a head of packed GGUF blocks
                ids = self.kernels.quant_greedy_head(h, head.kernel.packed, screen[1], head.kernel.out_features)
            else:
                ids = self.kernels.greedy_head(h, screen[0], screen[1], head.weight)
            if ids.numpy().min(initial=0) < 0:  # rows with non-finite values (-1): their full logits decide
                rest = ids < 0
                ids[rest] = super().greedy_tokens(h[rest], head)
            return ids
        logits = head(h)
        if logits.dim() != 2 or logits.dtype not in self.FUSED_DTYPES:
            return logits.float().argmax(dim=-1)
        # Every logit computed (bf16 heads, heads without a screen): the argmax in one vectorised pass.
        ids = self.kernels.argmax_rows(logits)
        if ids.numpy().min(initial=0) < 0:  # rows holding a NaN (-1): torch.argmax says which one wins
            rest = ids < 0
            ids[rest] = logits[rest].float().argmax(dim=-1)
        return ids

    def rms_norm(self, x, weight, eps):
        if x.dtype == weight.dtype and x.dtype in self.FUSED_DTYPES:
            return self.kernels.rms_norm(x.contiguous(), weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        if x.dtype == residual.dtype == weight.dtype and x.dtype in self.FUSED_DTYPES:
            return self.kernels.add_rms_norm(x.contiguous(), residual.contiguous(), weight, eps)
        return super().add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, cos, sin):
        if q.dtype == k.dtype == cos.dtype == sin.dtype and q.dtype in self.FUSED_DTYPES:
            return self.kernels.rotary(q, k, cos.contiguous(), sin.contiguous())
        return super().rotary(q, k, cos, sin)

    def silu_and_mul(self, gate_up):
        if gate_up.dtype in self.FUSED_DTYPES:
            return self.kernels.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate).mul_(up)  # one temporary instead of two

    def mlp(self, h, gate_up, down):
        # A prefill's rows in pieces of MLP_ROWS: each piece's gate_up output stays in cache for the activation and
        # the down projection instead of a [rows, 2 x intermediate] tensor going through memory. Rows are
        # independent in every kernel here, so this is bit-identical. Under tensor parallelism the down projection
        # all-reduces, once per call: no pieces there.
        if gate_up.lora_active:  # the deltas need [gate | up] and every row of the step in one call
            return super().mlp(h, gate_up, down)
        rows = h.shape[0] if h.dim() == 2 else -1
        if rows <= self.MLP_ROWS or h.dtype not in self.panel_dtypes or down.tp is not None:
            return self._mlp_rows(h, gate_up, down)
        return torch.cat([self._mlp_rows(h[r:r + self.MLP_ROWS], gate_up, down)
                          for r in range(0, rows, self.MLP_ROWS)])

    def _mlp_rows(self, h, gate_up, down):
        if getattr(gate_up.kernel, "gated", False) and h.dtype == gate_up.weight.dtype:
            return down(gate_up.kernel.silu(h, gate_up.bias))
        return super().mlp(h, gate_up, down)

    def lora_pack(self, a_t, bt, segments=None):
        """lora_add_'s tiles (lora_add.cc): a [ceil(r / 8), K, 8]; per segment (a fused module) its output columns in
        tiles of 8, each holding the segment's rank rows only ([rows, 8] in b, zero past the last column); tiles
        [Nt, 5] = (offset in b, first rank row, rank rows, y column, width)."""
        k, r = a_t.shape
        rt = (r + 7) // 8
        a = torch.nn.functional.pad(a_t.float(), (0, rt * 8 - r)).view(k, rt, 8).transpose(0, 1).contiguous()
        chunks, tiles, offset = [], [], 0
        for r0, r1, c0, c1 in segments or [(0, r, 0, bt.shape[1])]:
            n = -(-(c1 - c0) // 8)
            block = torch.nn.functional.pad(bt[r0:r1, c0:c1].float(), (0, n * 8 - (c1 - c0)))
            chunks.append(block.view(r1 - r0, n, 8).transpose(0, 1).reshape(-1))
            cols = torch.arange(c0, c1, 8)
            tiles.append(torch.stack([offset + torch.arange(n) * (r1 - r0) * 8, torch.full((n,), r0),
                                      torch.full((n,), r1 - r0), cols, (c1 - cols).clamp(max=8)], 1))
            offset += n * (r1 - r0) * 8
        return (a, torch.cat(chunks).contiguous(), torch.cat(tiles).to(torch.long).contiguous())

    def lora_add(self, x, y, groups):
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        if x2.dtype != y2.dtype:
            raise ValueError(f"lora_add: x is {x2.dtype} and y {y2.dtype}; one dtype expected")
        out = y2 if y2.is_contiguous() else y2.contiguous()
        self.kernels.lora_add_(out, x2.contiguous(), [g[0] for g in groups], [g[1] for g in groups],
                               [g[2] for g in groups], [g[3] for g in groups])
        if out is not y2:
            y2.copy_(out)

    def top_k_top_p(self, logits, k, p):
        if k is None and p is None:
            return logits
        return self.kernels.apply_top_k_top_p(logits, k, p)

    def exponential_race(self, probs, seeds, steps):
        if probs.dtype != torch.float32 or probs.device.type != "cpu":
            return super().exponential_race(probs, seeds, steps)
        return self.kernels.exponential_race(probs, seeds, steps)
