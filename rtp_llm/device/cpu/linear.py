"""Linear layers on the CPU: which copy of each weight the kernels read, chosen once at load and stored on the
layer (rtp_llm/layers/linear.py) as a CpuLinear, as vLLM's dispatch_cpu_unquantized_gemm does.

- float32 and bfloat16 on any CPU with AVX2: 48-column panels (rtp_llm/cpp/cpu/panel_linear.cc with AVX-512,
  panel_linear_avx2.cc without; bf16 as k-pairs for the CPU's bf16 dot products, fp32 sums) serve every row count,
  so the panels are the only copy, and a row's result never depends on the rows beside it (batch invariance). On
  AVX-512 (bf16: avx512_bf16) a gate_up projection whose output only feeds silu_and_mul is packed as gated panels
  (24 gate and the same 24 up rows each) so the SiLU runs in the GEMM's epilogue; a float32 run's GGUF gate_up
  keeps its blocks in that row order for the same epilogue (quant_linear_silu).
- otherwise (CPUs without AVX2, odd bf16 widths): oneDNN's blocked layout (the kernel family vLLM's CPU backend
  uses), and beside it, when `gemv_weights` allows, the plain weight for the GEMV kernel of steps of a few rows
  (rtp_llm/cpp/cpu/gemv.cc), which streams weights faster than oneDNN there.
- the LM head the same way; a tied head keeps its plain rows (the embedding lookup reads them), and a float32
  head on panels gets a bf16 screen for greedy steps (greedy_head.cc) whose exact recompute reads them too; a
  head of GGUF blocks gets the screen's error bounds only (its bf16 weights and exact rows decoded from the blocks).

Which copy a call uses (GEMV on few rows, else the packed copy, else torch) is decided in C++ by
torch.ops.rtp_llm.linear, the function the fused decoder layers call as well.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# Rows up to which the GEMV kernel streams the plain weight faster than oneDNN's packed GEMM, per instruction
# set and dtype (benchmarks.cpu_linear --stream; figures in benchmarks/ARCHIVE.md).
GEMV_MAX_ROWS = {"avx512": {torch.float32: 16, torch.bfloat16: 8},
                 "avx2": {torch.float32: 4, torch.bfloat16: 4}}
# oneDNN's reorder takes the expected row count as a hint for the blocked format; any count works.
PACK_ROWS_HINT = 32
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)
# gemv_weights=auto keeps the plain copies when they take at most this share of the available memory.
GEMV_MEMORY_SHARE = 0.25
GEMV_WEIGHTS = ("auto", "on", "off")


def onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def onednn_bf16() -> bool:
    """oneDNN packs bf16 weights only on CPUs with avx512bw/vl/dq or avx_ne_convert; elsewhere a bf16 linear layer
    keeps its plain weight (torch's matmul)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


class CpuLinear:
    """One linear layer's kernel: `packed` (panels, gated panels or oneDNN's blocked layout; None: none) and
    `plain` (the [N, K] weight, kept for the GEMV kernel up to `gemv_rows` rows or when nothing is packed)."""

    def __init__(self, kernels, out_features: int, plain: Optional[torch.Tensor], packed: Optional[torch.Tensor],
                 gemv_rows: int = 0, gated: bool = False):
        self.kernels = kernels
        self.out_features = out_features
        self.plain, self.packed, self.gemv_rows, self.gated = plain, packed, gemv_rows, gated
        # greedy heads: (bf16 panels, bounds); a head of packed GGUF blocks: (None, bounds)
        self.screen: Optional[tuple[Optional[torch.Tensor], torch.Tensor]] = None

    @property
    def on_panels(self) -> bool:
        return (self.packed is not None and not self.packed.is_mkldnn and self.packed.dim() == 3
                and self.packed.dtype != torch.uint8)

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        if self.gated:
            y = self._gate_up(x2, bias)
        else:
            y = self.kernels.linear(x2, self.plain, self.packed, bias, self.out_features, self.gemv_rows)
        return y.reshape(*shape[:-1], y.shape[-1])

    def silu(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """silu(gate) * up from gated panels: bit for bit silu_and_mul of [gate | up], without writing it."""
        shape = x.shape
        act = self.kernels.linear_silu(x.reshape(-1, shape[-1]).contiguous(), self.packed, bias,
                                       self.out_features // 2)
        return act.reshape(*shape[:-1], act.shape[-1])

    def _gate_up(self, x, bias):
        # [gate | up] from gated panels (the MLP never asks; kept so that a linear layer means the same whatever its
        # kernel): panel p holds columns [gate 24p..24p+23, up 24p..24p+23], the bias put in that order so that it
        # is added before the rounding, as panel_linear adds it.
        inter = self.out_features // 2
        blocks = (inter + 23) // 24
        pad = blocks * 24 - inter
        if bias is not None:
            bias = torch.nn.functional.pad(bias.view(2, inter), (0, pad)).view(2, blocks, 24)
            bias = bias.transpose(0, 1).reshape(-1)
        y = self.kernels.linear(x, None, self.packed, bias, blocks * 48, 0)
        y = y.view(-1, blocks, 2, 24).transpose(1, 2).reshape(-1, 2, blocks * 24)[:, :, :inter]
        return y.reshape(-1, 2 * inter)


def gated_rows(parts: list[torch.Tensor], inter: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The rows of [gate; up] (blocks, in `parts`) in pack_gated_panels' order, [gate 0-23, up 0-23, gate 24-47,
    ...], zero blocks (zero weights) padding the last 24; and each original row's position there."""
    bounds, at = [], 0
    for p in parts:
        bounds.append((at, p))
        at += p.shape[0]

    def rows(start: int, stop: int) -> list[torch.Tensor]:  # rows [start, stop) of the parts, as views
        return [p[max(start - a, 0):min(stop - a, p.shape[0])] for a, p in bounds
                if a < stop and a + p.shape[0] > start]

    panels = (inter + 23) // 24
    out = []
    for j in range(0, panels * 24, 24):
        n = min(24, inter - j)
        for half in (0, inter):
            out += rows(half + j, half + j + n)
            if n < 24:
                out.append(torch.zeros((24 - n,) + tuple(parts[0].shape[1:]), dtype=torch.uint8))
    i = torch.arange(2 * inter)
    j = i % inter
    order = (j // 24) * 48 + (i >= inter).long() * 24 + j % 24
    return out, order


class LinearPlanner:
    """Chooses and packs every linear layer's kernel (CpuOps.prepare_linears)."""

    def __init__(self, kernels, gemv_weights: str, available_memory: Callable[[], int]):
        if gemv_weights not in GEMV_WEIGHTS:
            raise ValueError(f"cpu_gemv_weights must be auto, on or off, got {gemv_weights!r}")
        self.kernels = kernels
        self.gemv_weights = gemv_weights
        self.available_memory = available_memory
        isa = kernels.cpu_isa()
        self.gemv_rows = GEMV_MAX_ROWS.get(isa, {})
        # Panels wherever there is AVX2 (panel_linear_avx2.cc without AVX-512 / avx512_bf16): a row's bits never
        # depend on the rows beside it. The SiLU epilogue of gated panels exists on the AVX-512 kernels only.
        self.panel_dtypes = (torch.float32, torch.bfloat16) if isa in ("avx512", "avx2") else ()
        self.gated_dtypes = ((torch.float32,) if isa == "avx512" else ()) + (
            (torch.bfloat16,) if kernels.cpu_avx512_bf16() else ())
        self.keeps_plain_weights = False  # decided in assign()

    def on_panels(self, w: torch.Tensor) -> bool:
        # bf16 panels hold k in pairs: even widths only (an odd one keeps oneDNN), so that a pair panel's width is
        # always 2 x its pairs.
        return w.dtype in self.panel_dtypes and w.dim() == 2 and (w.dtype == torch.float32 or w.shape[1] % 2 == 0)

    def _packs_onednn(self, w: torch.Tensor) -> bool:
        return (onednn_available() and w.dtype in ONEDNN_DTYPES and w.dim() == 2 and w.numel() > 0
                and (w.dtype != torch.bfloat16 or onednn_bf16()))

    def _keep_plain(self, plain_bytes: int) -> bool:
        if self.gemv_weights != "auto":
            return self.gemv_weights == "on"
        return plain_bytes <= GEMV_MEMORY_SHARE * self.available_memory()

    def assign(self, linears, head, greedy_screen: bool) -> None:
        """Gives each Linear (and the head) its CpuLinear. A plain weight the kernels no longer read is released."""
        quantized = [lin for lin in linears if lin.quantized is not None]
        linears = [lin for lin in linears if lin.quantized is None]
        # the file's blocks, repacked (16 rows interleaved per block: quant_packed.h), are the only copy:
        # quant_linear reads them (linear.cc), and so does a tied embedding's row lookup
        for lin in quantized + ([head] if head is not None and head.quantized is not None else []):
            q = lin.quantized
            # float32 runs: a gate_up's rows in gated panels' order, the SiLU in the kernel's epilogue (bf16 runs
            # round gate_up to bf16 before the activation, which the fp32 epilogue does not)
            gated = lin.feeds_silu and q.shape[0] % 2 == 0 and lin.weight.dtype == torch.float32
            if q.packed is None:
                parts, order = gated_rows(q.file_blocks(), q.shape[0] // 2) if gated else (q.file_blocks(), None)
                q.repacked(self.kernels.quant_pack(parts), order)
            lin.kernel = CpuLinear(self.kernels, q.shape[0], None, q.packed, gated=q.row_order is not None)
        if head is not None and head.quantized is not None and greedy_screen and head.weight.dtype == torch.float32 \
                and self.kernels.cpu_avx512_bf16():
            head.kernel.screen = self._quant_screen(head.quantized)
        onednn = [lin.weight for lin in linears if not self.on_panels(lin.weight) and self._packs_onednn(lin.weight)]
        self.keeps_plain_weights = bool(onednn) and self._keep_plain(sum(w.numel() * w.element_size()
                                                                         for w in onednn))
        for lin in linears:
            lin.kernel = self._kernel(lin.weight, gated=lin.feeds_silu, keep_plain=self.keeps_plain_weights)
            if lin.kernel.plain is None:
                lin.weight.data = torch.empty(0, dtype=lin.weight.dtype)  # the packed copy replaces it
        if head is None or head.quantized is not None:  # None: a pooling model without an LM head
            return
        w = head.weight
        kernel = self._kernel(w, gated=False, keep_plain=True)
        screen = (kernel.on_panels and w.dtype == torch.float32 and greedy_screen and w.numel() > 0
                  and self.kernels.cpu_avx512_bf16() and bool(torch.isfinite(w).all()))
        if screen:  # the exact recompute of the few candidates reads the plain rows: kept
            kernel.screen = self.kernels.pack_greedy_screen(w.data)
        elif kernel.on_panels and not head.tied:
            kernel.plain = None
            w.data = torch.empty(0, dtype=w.dtype)  # an untied head on panels: the panels are its only use
        head.kernel = kernel

    def _quant_screen(self, q):
        """(None, bounds): a packed head's greedy screen needs only the error bounds of its dequantized rows (the
        bf16 weights are decoded from the blocks at each step: no copy); None when a weight is not finite."""
        try:
            return None, self.kernels.quant_greedy_bounds(q.packed, q.shape[0])
        except RuntimeError as exc:
            if "non-finite" not in str(exc):
                raise
            return None

    def _kernel(self, w: torch.Tensor, gated: bool, keep_plain: bool) -> CpuLinear:
        n, rows = w.shape[0], self.gemv_rows.get(w.dtype, 0)
        if self.on_panels(w) and w.numel() > 0:
            if gated and n % 2 == 0 and w.dtype in self.gated_dtypes:
                return CpuLinear(self.kernels, n, None, self.kernels.pack_gated_panels(w.data), gated=True)
            return CpuLinear(self.kernels, n, None, self.kernels.pack_panels(w.data))
        if self._packs_onednn(w):
            packed = torch.ops.mkldnn._reorder_linear_weight(w.data, PACK_ROWS_HINT)
            return CpuLinear(self.kernels, n, w if keep_plain else None, packed, rows if keep_plain else 0)
        return CpuLinear(self.kernels, n, w, None, rows)
