"""The CPU's fused-op set: torch ops, except
- linear layers, float32 on a CPU with AVX-512: weights repacked once, at load, into 48-column panels and
  multiplied by the panel kernel (rtp_llm/cpp/ops/panel_linear.cc) at every row count, replacing the plain
  weights (one copy). Against oneDNN's packed GEMM with SmolLM2's weights streamed from memory
  (benchmarks/cpu_linear.py --stream, ms per 30 layers): 1 row ~13.5-16 vs ~19-27, 8 rows ~14.5 vs ~22, 16 rows
  ~20.5 vs ~27.5, 32 rows ~36 vs ~43; at the same speed as the plain-layout GEMV kernel on 1-2 rows, faster
  from 4. In cache at 4096 rows (prefill) within ~5-10% of oneDNN;
- bfloat16 linear layers on a CPU with avx512_bf16: the same panels holding k in bf16 pairs, multiplied with
  the CPU's bf16 dot products (exact products, fp32 sums, one rounding of the output); even input widths;
- other linear layers (CPUs without AVX-512, bf16 without avx512_bf16): weights repacked once into oneDNN's blocked
  layout and multiplied with oneDNN's matmul (the kernel family vLLM's CPU backend uses; bf16: the CPU's bf16
  dot products with fp32 accumulation). Against F.linear (MKL, which packs the weight on every call), on
  SmolLM2's shapes here (benchmarks/cpu_linear.py): 2-3.7x at 4 rows, 1.2-1.5x at 32 rows, 1.1-1.2x at 4096
  rows. Steps of a few rows are weight streaming, where oneDNN reaches ~18-22 GB/s here and a plain-layout
  GEMV kernel (rtp_llm/cpp/ops/skinny_linear.cc, gemv_avx512.cc) ~27-30 GB/s (up to 8 rows bf16 with
  AVX-512, 4 with AVX2 only, where packed catches up): with gemv_weights on, the plain copies stay beside the
  packed ones for that kernel (the weights' memory twice); off, they are released. auto keeps them when they
  fit in a quarter of the available memory;
- the LM head: packed the same way (panels or blocked), the GEMV kernel on few rows where it applies; a tied
  embedding keeps its plain copy (the embedding lookup needs it), an untied head on panels does not, unless
  the greedy screen reads it;
- greedy steps (every sampled row greedy, nothing reshaping the logits): a float32 head on panels, on CPUs with
  avx512_bf16, finds each row's argmax through a bf16 copy of the head with a proven per-logit error bound,
  then recomputes the few candidates in fp32 in the panel kernel's order (rtp_llm/cpp/ops/greedy_head.cc):
  the same ids as the logits' argmax, without computing every logit in fp32;
- RMSNorm, residual add + RMSNorm and RoPE: one C++ op each (rtp_llm/cpp/ops/fused_norm_rotary.cc)
  instead of 6-12 aten ops, whose dispatch dominates them at decode batch sizes (float32 and bfloat16);
- the SiLU-gated activation: one vectorised pass (rtp_llm/cpp/ops/silu_and_mul.cc) instead of three; and
  without tensor parallelism, with gate_up on panels, none at all: gate_up is packed as gated panels (24 gate
  and the same 24 up rows each) and the panel kernel applies silu(gate) * up to its accumulators
  (panel_linear_silu), bit for bit the separate ops without the [rows, 2 x intermediate] intermediate;
- a step whose rows are all decodes or short chunks (any batch size): every decoder layer in one C++ call
  (rtp_llm/cpp/ops/decode_layers.cc), the same kernels in the same order, so bit-identical, without ~18
  Python-level torch calls per layer that leave the memory bus idle (~3 ms of a 21 ms batch-1 step);
- top-k/top-p: the C++ twin of the operator (rtp_llm/cpp/ops/top_k_top_p.cc), bit-identical masks
  without sorting the vocabulary (benchmarks/top_k_top_p.py)."""

import torch

from rtp_llm.layers.ops import TorchOps


def _onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class CpuOps(TorchOps):
    name = "cpu"

    # Up to this many rows the GEMV kernel beats oneDNN's packed GEMM on weights streamed from memory
    # (benchmarks/cpu_linear.py --stream, ms per 30 layers). The AVX2 kernel at 4 rows: fp32 ~17-18 vs ~18.7,
    # bf16 ~9.5 vs ~11.7, at 8 rows packed is faster in both dtypes. The AVX-512 kernel, fp32: 8 rows ~16 vs
    # ~22-25 (still at the memory bandwidth), 12 rows ~19.5 vs ~23.5, 16 rows ~24.5 vs ~25.7 (with AVX-512
    # float32 weights go to the panel kernel instead, faster still); bf16 (oneDNN has the CPU's bf16 dot
    # products, the kernel widens to fp32): 8 rows ~11.5-14 vs ~11.5-13.7, packed ahead from 10.
    GEMV_MAX_ROWS = {"avx512": {torch.float32: 16, torch.bfloat16: 8},
                     "avx2": {torch.float32: 4, torch.bfloat16: 4}}
    # oneDNN's reorder takes the expected row count as a hint for the blocked format; any count works.
    PACK_ROWS_HINT = 32
    # bf16: oneDNN uses the CPU's bf16 dot-product instructions with fp32 accumulation (about 2x fp32 at 32 rows
    # on avx512_bf16 here).
    PACKED_DTYPES = (torch.float32, torch.bfloat16)
    # The fused norm / RoPE kernels: float32 math, bf16 rounded where the reference rounds.
    FUSED_DTYPES = (torch.float32, torch.bfloat16)

    # Rows per piece of a prefill's MLP (mlp()); tuned below.
    MLP_ROWS = 512
    # auto keeps the plain copies when they take at most this share of the available memory.
    GEMV_MEMORY_SHARE = 0.25

    def __init__(self, gemv_weights: str = "auto"):
        from rtp_llm._native import ops

        if gemv_weights not in ("auto", "on", "off"):
            raise ValueError(f"gemv_weights must be auto, on or off, got {gemv_weights!r}")
        self._kernels = ops()
        self._gemv_rows = self.GEMV_MAX_ROWS.get(self._kernels.gemv_isa(), {})
        self._gemv_weights = gemv_weights
        self.keeps_plain_weights = False  # decided in prepare()
        # float32 weights go to the panel kernel where the CPU has AVX-512 (RTP_LLM_CPU_NO_AVX512=1: oneDNN).
        # bfloat16 too where the CPU has avx512_bf16 (the kernel's bf16 dot products, fp32 sums).
        self.panel_dtypes = ((torch.float32,) if self._kernels.panel_linear_enabled() else ()) + (
            (torch.bfloat16,) if self._kernels.panel_linear_bf16_enabled() else ())
        # id(weight parameter) -> the copy the kernel multiplies with: panels (3-D, float32) or oneDNN's blocked
        self._packed: dict[int, torch.Tensor] = {}
        self._out_features: dict[int, int] = {}  # id(weight parameter) -> rows of the weight (panels pad them)
        # id(gate_up weight) whose panels are pack_gated_panels' (24 gate + 24 up rows each): mlp() runs
        # panel_linear_silu on them, the SiLU in the GEMM's epilogue
        self._gated: set[int] = set()
        self.fuse_decode_layers = True  # benchmarks and tests switch it off to compare
        # Greedy steps screen the vocabulary with a bf16 copy of the LM head (greedy_tokens); read in prepare().
        self.greedy_screen = True
        self._screens: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(head) -> (bf16 panels, bounds)
        # id(model) -> (decode_layers' flat weight list, whether gate_up is gated in every layer; None: mixed)
        self._layer_weights: dict[int, tuple] = {}

    def _keep_plain(self, plain_bytes: int) -> bool:
        if self._gemv_weights != "auto":
            return self._gemv_weights == "on"
        from rtp_llm.device.cpu import CpuDevice

        available, _ = CpuDevice().memory_info()
        return plain_bytes <= self.GEMV_MEMORY_SHARE * available

    def zeros_buffer(self, shape, dtype, device):
        # On 2 MB pages (rtp_llm/cpp/ops/huge_pages.cc): the decode kernels stream the KV cache, and with 4 KB
        # pages its scattered blocks cost a TLB miss and a prefetcher restart every 4 KB (a W-like step's
        # attention: ~14-16 vs ~17-18 ms here).
        if torch.device(device).type != "cpu":
            return super().zeros_buffer(shape, dtype, device)
        return self._kernels.huge_page_zeros(list(shape), dtype)

    def _on_panels(self, w) -> bool:
        # bf16 panels hold k in pairs: even widths only (an odd one keeps oneDNN), so that a pair panel's
        # width is always 2 x its pairs (decode_layers reads the MLP width off the down projection's panels).
        return w.dtype in self.panel_dtypes and (w.dtype == torch.float32 or w.shape[1] % 2 == 0)

    def _pack(self, w, gated: bool = False) -> torch.Tensor:
        self._out_features[id(w)] = w.shape[0]
        if self._on_panels(w) and gated:
            packed = self._kernels.pack_gated_panels(w.data)
            self._gated.add(id(w))
        elif self._on_panels(w):
            packed = self._kernels.pack_panels(w.data)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.data, self.PACK_ROWS_HINT)
        self._packed[id(w)] = packed
        return packed

    def prepare(self, model) -> None:
        """Called once after the weights are loaded."""
        if not (_onednn_available() or self.panel_dtypes):
            return
        dtypes = self.panel_dtypes if not _onednn_available() else self.PACKED_DTYPES
        weights = [w for layer in model.layers
                   for w in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight)
                   if w.dtype in dtypes and w.dim() == 2 and w.numel()]
        # The panel kernel serves every row count, so its weights need no plain copy.
        gemv_weights = [w for w in weights if not self._on_panels(w)]
        self.keeps_plain_weights = bool(gemv_weights) and self._keep_plain(
            sum(w.numel() * w.element_size() for w in gemv_weights))
        # Without tensor parallelism the MLP is one op (mlp()), so gate_up's panels can be the gated ones; a
        # rank's shard goes through linear() and the all-reduce path (rtp_llm/models/decoder.py).
        gated = {id(layer.gate_up_weight) for layer in model.layers} if getattr(model, "tp", None) is None else set()
        for w in weights:
            on_panels = self._on_panels(w)
            self._pack(w, gated=id(w) in gated and w.shape[0] % 2 == 0)
            if on_panels or not self.keeps_plain_weights:
                w.data = torch.empty(0, dtype=w.dtype)  # the packed copy replaces it
        head = model.embed if model.lm_head is None else model.lm_head
        if head.dtype in dtypes:
            on_panels = self._on_panels(head)
            self._pack(head)
            screen = (on_panels and head.dtype == torch.float32 and self.greedy_screen and head.numel()
                      and self._kernels.greedy_screen_enabled() and bool(torch.isfinite(head).all()))
            if screen:  # the exact recompute of the few candidates reads the plain rows: kept
                self._screens[id(head)] = self._kernels.pack_greedy_screen(head.data)
            elif head is model.lm_head and on_panels:
                head.data = torch.empty(0, dtype=head.dtype)  # untied: the panels are its only use

    def _packed_linear(self, x, packed, bias, weight):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        if id(weight) in self._gated:
            y = self._gated_linear(x2, packed, bias, self._out_features[id(weight)] // 2)
        elif packed.dim() == 3:  # panels
            y = self._kernels.panel_linear(x2, packed, bias, self._out_features[id(weight)])
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")
        return y.reshape(*shape[:-1], y.shape[-1])

    def _gated_linear(self, x, panels, bias, inter):
        # [gate | up] from gated panels (mlp() never needs it; kept so that linear() means the same for every
        # weight): the panels' columns are [gate 24p..24p+23, up 24p..24p+23] per panel p, the bias put in that
        # order so that it is added before the rounding, as panel_linear adds it.
        blocks = panels.shape[0]
        pad = blocks * 24 - inter
        if bias is not None:
            bias = torch.nn.functional.pad(bias.view(2, inter), (0, pad)).view(2, blocks, 24)
            bias = bias.transpose(0, 1).reshape(-1)
        y = self._kernels.panel_linear(x, panels, bias, blocks * 48)
        y = y.view(-1, blocks, 2, 24).transpose(1, 2).reshape(-1, 2, blocks * 24)[:, :, :inter]
        return y.reshape(-1, 2 * inter)

    def _gemv(self, x, weight) -> bool:
        return (x.dim() == 2 and x.shape[0] <= self._gemv_rows.get(x.dtype, 0) and weight.numel() > 0
                and x.dtype == weight.dtype and weight.dtype not in self.panel_dtypes)

    def linear(self, x, weight, bias=None):
        if self._gemv(x, weight):
            return self._kernels.skinny_linear(x, weight, bias)
        packed = self._packed.get(id(weight))
        if packed is not None and x.dtype == weight.dtype:  # (bf16 panels are int32 pairs)
            return self._packed_linear(x, packed, bias, weight)
        return super().linear(x, weight, bias)

    def lm_head(self, h, weight):
        if self._gemv(h, weight):
            return self._kernels.skinny_linear(h, weight)
        packed = self._packed.get(id(weight))
        if packed is not None and h.dtype == weight.dtype:
            return self._packed_linear(h, packed, None, weight)
        return super().lm_head(h, weight)

    def greedy_tokens(self, h, weight):
        # float32 heads on panels, CPUs with avx512_bf16 (rtp_llm/cpp/ops/greedy_head.cc): a bf16 screen with a
        # proven error bound, then the few candidates in fp32 in the panel kernel's exact order: the same ids as
        # lm_head(h).argmax(), ~1.7x faster at 32 rows and ~3x at one row (half the bytes, twice the FMA rate).
        screen = self._screens.get(id(weight))
        if screen is None or h.dtype != torch.float32 or h.dim() != 2:
            return super().greedy_tokens(h, weight)
        ids = self._kernels.greedy_head(h, screen[0], screen[1], weight)
        rest = ids < 0  # rows with non-finite values: their full logits decide
        if bool(rest.any()):
            ids[rest] = super().greedy_tokens(h[rest], weight)
        return ids

    def rms_norm(self, x, weight, eps):
        if x.dtype == weight.dtype and x.dtype in self.FUSED_DTYPES:
            return self._kernels.rms_norm(x.contiguous(), weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        if x.dtype == residual.dtype == weight.dtype and x.dtype in self.FUSED_DTYPES:
            return self._kernels.add_rms_norm(x.contiguous(), residual.contiguous(), weight, eps)
        return super().add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, cos, sin):
        if q.dtype == k.dtype == cos.dtype == sin.dtype and q.dtype in self.FUSED_DTYPES:
            return self._kernels.rotary(q, k, cos.contiguous(), sin.contiguous())
        return super().rotary(q, k, cos, sin)

    def silu_and_mul(self, gate_up):
        if gate_up.dtype in self.FUSED_DTYPES:
            return self._kernels.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate).mul_(up)  # one temporary instead of two

    def mlp(self, h, gate_up_weight, gate_up_bias, down_weight, down_bias):
        # A prefill's rows in pieces of MLP_ROWS: each piece's gate_up output stays in cache for silu_and_mul
        # and the down projection instead of a [rows, 2 x intermediate] tensor going through memory (SmolLM2
        # at 4096 rows: 50 MB per layer). Rows are independent in every kernel here, so this is bit-identical.
        rows = h.shape[0] if h.dim() == 2 else -1
        if rows <= self.MLP_ROWS or h.dtype not in self.panel_dtypes:
            return self._mlp_rows(h, gate_up_weight, gate_up_bias, down_weight, down_bias)
        return torch.cat([self._mlp_rows(h[r:r + self.MLP_ROWS], gate_up_weight, gate_up_bias, down_weight, down_bias)
                          for r in range(0, rows, self.MLP_ROWS)])

    def _mlp_rows(self, h, gate_up_weight, gate_up_bias, down_weight, down_bias):
        # gated panels: silu(gate) * up straight from the GEMM's accumulators (pack_gated_panels), bit for bit
        # silu_and_mul of the [rows, 2 x intermediate] product without writing and re-reading it (a prefill
        # piece's gate_up + SiLU ~4% faster, rtp_llm/cpp/ops/panel_linear.cc)
        if id(gate_up_weight) in self._gated and h.dtype == gate_up_weight.dtype:
            shape = h.shape
            act = self._kernels.panel_linear_silu(h.reshape(-1, shape[-1]).contiguous(),
                                                  self._packed[id(gate_up_weight)], gate_up_bias,
                                                  self._out_features[id(gate_up_weight)] // 2)
            return self.linear(act.reshape(*shape[:-1], act.shape[-1]), down_weight, down_bias)
        return super().mlp(h, gate_up_weight, gate_up_bias, down_weight, down_bias)

    def decode_layers(self, model, x, cos, sin, kv, attn, meta):
        # Every row goes through the paged attention kernel (decodes, short chunks after a cached prefix:
        # rtp_llm/layers/attention/cpu.py), no tensor parallelism, the KV cache in the model's dtype. The C++ op
        # picks each linear kernel as linear() does (GEMV up to the same row count on plain weights, then the
        # packed copy: panels or oneDNN's blocked layout).
        first = model.layers[0]
        if not (self.fuse_decode_layers and getattr(meta, "all_paged", False) and model.tp is None
                and x.dtype in self.FUSED_DTYPES and kv.dtype == x.dtype == cos.dtype
                and first.qkv_weight.dtype == x.dtype):
            return None
        cached = self._layer_weights.get(id(model))
        if cached is None:
            weights = [
                w for layer in model.layers for w in (
                    layer.input_norm, layer.qkv_weight, layer.qkv_bias, layer.q_norm, layer.k_norm, layer.o_weight,
                    layer.o_bias, layer.post_norm, layer.gate_up_weight, layer.gate_up_bias, layer.down_weight,
                    layer.down_bias, *(self._packed.get(id(p)) for p in (layer.qkv_weight, layer.o_weight,
                                                                         layer.gate_up_weight, layer.down_weight)))]
            gated = {id(layer.gate_up_weight) in self._gated for layer in model.layers}
            # the op takes gated panels in every layer or in none (prepare() treats all layers alike)
            cached = self._layer_weights[id(model)] = (weights, gated.pop() if len(gated) == 1 else None)
        weights, gated = cached
        if gated is None:
            return None
        return self._kernels.decode_layers(x.contiguous(), weights, kv.buffer, cos.contiguous(), sin.contiguous(),
                                           meta.slots, meta.paged_table, meta.paged_lens, first.num_heads,
                                           first.num_kv_heads, model.cfg.rms_norm_eps, attn.scale,
                                           self._gemv_rows.get(x.dtype, 0) if x.dtype not in self.panel_dtypes else 0,
                                           gated)

    def top_k_top_p(self, logits, k, p):
        if k is None and p is None:
            return logits
        return self._kernels.apply_top_k_top_p(logits, k, p)
