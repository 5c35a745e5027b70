// The CPU kernels as C++ functions: one family per file (its _avx512 twin chosen at run time where it has one),
// every one registered as a torch operator (torch.ops.rtp_llm.<name>) in torch_bindings.cc, and callable from
// the ops built of several (decoder_layers.cc, linear.cc).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "rtp_llm/cpp/cpu/cpu_features.h"

namespace rtp_llm {

// --- linear layers (linear.cc): the per-call choice between a layer's copies of its weight -----------------
// x [M, K] @ W^T (+ bias) -> [M, n]: the GEMV kernel on `plain` when it is there and M <= gemv_max_rows, else
// `packed` (packed GGUF blocks: quant_linear; panels: panel_linear; oneDNN's blocked layout: its matmul), else
// at::linear on `plain`.
at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& plain, const std::optional<at::Tensor>& packed,
                  const std::optional<at::Tensor>& bias, int64_t n, int64_t gemv_max_rows);
// The same into out (contiguous [M, n], x's dtype): panels and GGUF blocks write there, the other kernels are copied
// in.
void linear_out(const at::Tensor& x, const std::optional<at::Tensor>& plain, const std::optional<at::Tensor>& packed,
                const std::optional<at::Tensor>& bias, int64_t n, int64_t gemv_max_rows, at::Tensor& out);
// silu(gate) * up [M, inter] from a gate_up copy packed in pack_gated_panels' row order: gated panels
// (panel_linear_silu) or GGUF blocks in that order (quant_linear_silu).
at::Tensor linear_silu(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t inter);

// --- GEMV (gemv.cc, gemv_avx512.cc): few rows against a plain [N, K] weight ---------------------------------
constexpr int64_t kGemvMaxRows = 16;
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);
// out[m, n] = x[m, k] (float32) @ w[n, k]^T (+ bias[n]), rounded once to out's type; 1 <= m <= kGemvMaxRows.
void gemv_avx512(const float* w, const float* x, const float* bias, float* out, int64_t m, int64_t k, int64_t n);
void gemv_avx512(const c10::BFloat16* w, const float* x, const float* bias, c10::BFloat16* out, int64_t m,
                 int64_t k, int64_t n);

// --- GGUF block weights (quant_linear.cc, quant_linear_avx512.cc; formats in quant_blocks.h, quant_packed.h) --
// The file's blocks, uint8 [N, K / 32 or K / 256, block bytes] (several: their rows in order, as q | k | v),
// repacked for the kernels: 16 rows interleaved per block, [ceil(N / 16), blocks, 16 x row bytes]
// (quant_packed.h). Read straight from the file's mapping: no concatenated copy is made.
at::Tensor quant_pack(const std::vector<at::Tensor>& parts);
// x [M, K] (float32 or bfloat16) @ W^T (+ bias) -> [M, n] for W = quant_pack(blocks) with n rows: each weight
// exactly gguf's dequantized float32 value, the fp32 panels' sums (bit for bit panel_linear on the dequantized
// matrix), at every M and on every CPU.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, int64_t n);
// The same into out, a contiguous [M, n] tensor in x's dtype (a row range of a bigger one).
void quant_linear_out(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, int64_t n,
                      at::Tensor& out);
// The SiLU-gated MLP's first half on blocks packed in pack_gated_panels' row order (quant_pack of the parts
// [gate 0-23, up 0-23, gate 24-47, ...], zero blocks past I; ceil(I / 24) x 48 rows): silu(gate) * up [M, I], bit
// for bit silu_and_mul(quant_linear) of [gate | up]. float32 x on AVX-512 runs the SiLU in the kernel's epilogue
// (panels, or registers up to kQuantDirectRows rows); other calls compute [gate | up] and silu_and_mul. bias [2 I]
// ([gate; up]) or none.
at::Tensor quant_linear_silu(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                             int64_t inter);
// Rows up to which quant_linear's kernels decode the blocks in registers instead of into a panel.
constexpr int64_t kQuantDirectRows = 4;
// The blocks as float32 [N, K] (gguf.quants.dequantize's values): references, tensor-parallel fallbacks.
at::Tensor quant_dequantize(const at::Tensor& w);
// Rows `rows` (int64, any shape) of a packed weight with n rows, dequantized: [*rows.shape, K] (embedding lookups).
at::Tensor quant_packed_rows(const at::Tensor& w, const at::Tensor& rows, int64_t n);
// A packed weight's quant::Format, checked against its n rows (errors name `op`), and its elements per block.
int quant_packed_format(const at::Tensor& w, int64_t n, const char* op);
int64_t quant_packed_elements(int format);
// The calling thread's panel scratch of at least `floats` floats (64-byte aligned, kept between calls): where the
// block kernels decode a panel.
float* quant_thread_panel(int64_t floats);
// format: quant::Format; the AVX-512 kernel of quant_linear on packed blocks.
void quant_linear_avx512(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                         int64_t k, int64_t n);
// The same on 8 lanes (quant_linear_avx2.cc), where the CPU lacks AVX-512: the same weights and sums, so the same bits.
void quant_linear_avx2(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                       int64_t k, int64_t n);
// quant_linear_silu's AVX-512 kernel: bias in the panels' order, out [m, inter].
void quant_linear_silu_avx512(int format, const uint8_t* w, const float* x, const float* bias, float* out, int64_t m,
                              int64_t k, int64_t inter);
// greedy_head's screen on packed blocks (avx512_bf16): out [m, n] = x (bf16 pairs [m, k / 2]) . bf16(w_j), each
// weight's exact value rounded to nearest even; and row j of a packed weight, dequantized (k floats).
void quant_screen_avx512(int format, const uint8_t* w, const uint32_t* x_pairs, float* out, int64_t m, int64_t k,
                         int64_t n);
void quant_row_avx512(int format, const uint8_t* w, int64_t k, int64_t row, float* out);

// --- the panel GEMM (panel_linear.cc, AVX-512) --------------------------------------------------------------
constexpr int64_t kPanelCols = 48;
// w [N, K] float32 -> panels [ceil(N / 48), K, 48]: panels[p, k, c] = w[48p + c, k], zero past row N.
// w bfloat16 -> pack_pair_panels(w).
at::Tensor pack_panels(const at::Tensor& w);
// w [N, K] (bfloat16, or float32 rounded to nearest even) -> [ceil(N / 48), ceil(K / 2), 48] int32: at [p, i, c]
// the bf16 pair (w[48p + c, 2i] low half, w[48p + c, 2i + 1] high half), zero past row N and column K.
at::Tensor pack_pair_panels(const at::Tensor& w);
// x [M, K] @ w^T (+ bias) -> [M, n], w given as pack_panels(w) and its row count n.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                        int64_t n);
// The same into out, a contiguous [M, n] tensor in x's dtype (a row range of a bigger one).
void panel_linear_out(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias, int64_t n,
                      at::Tensor& out);
// The SiLU-gated MLP's first half in one pass. w [2 I, K] = [gate; up] (float32 or bfloat16) -> panels of 24
// gate and the same 24 up rows each ([ceil(I / 24), K (bf16: pairs), 48]); panel_linear_silu(x, panels,
// bias [2 I] or none, I) = silu(gate) * up [M, I]: bit for bit silu_and_mul(panel_linear(x, pack_panels(w)))
// without the [M, 2 I] intermediate.
at::Tensor pack_gated_panels(const at::Tensor& w);
at::Tensor panel_linear_silu(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias,
                             int64_t inter);
// A gated gate_up's bias [2 I] ([gate; up]) in the panels' column order (24 gate, 24 up per panel, zero past I),
// float32 [ceil(I / 24) x 48]; undefined for none. op names the caller in the error for a wrong size.
at::Tensor gated_bias(const std::optional<at::Tensor>& bias, int64_t inter, const char* op);
// Within its scope, the panel GEMMs this thread calls are followed by the one on `panels` (pack_panels' or
// pack_gated_panels' copy; none or another layout: nothing is assumed): each pool thread's last panel requests
// the first panel it will likely take there, as it does within a GEMM. A prefetch hint, no result changes.
class PanelsAfter {
  public:
    explicit PanelsAfter(const std::optional<at::Tensor>& panels);
    ~PanelsAfter();
    PanelsAfter(const PanelsAfter&) = delete;
    PanelsAfter& operator=(const PanelsAfter&) = delete;

  private:
    const char* saved_base_;  // the enclosing scope's hint
    int64_t saved_bytes_, saved_panels_;
};
// The kernels on raw pointers (out [m, n] row-major; bias may be null). bf16: x as [m, pairs] bf16 pairs;
// products exact in fp32, summed in fp32 (each pair's high then low product), the output rounded to bf16.
void panel_linear_avx512(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                         int64_t n);
// Rows x[0, rows) by one fp32 panel [k, 48] into out's columns [0, cols) (row stride ldo, bias at those columns):
// panel_linear's tiles and row blocks, the same bits; `lines` cache lines from `prefetch` requested meanwhile,
// whatever the row count (the next panel's blocks, while this decoded one is in cache).
void panel_block_fp32(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                      int cols, int64_t rows, const char* prefetch, int64_t lines);
// The same for one gated fp32 panel (pack_gated_panels' order: 24 gate then 24 up columns, bias likewise): out's
// columns [0, cols) = silu(gate) * up, panel_linear_silu's bits (from column exact_from on, its scalar tail).
void panel_block_silu_fp32(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                           int cols, int exact_from, int64_t rows, const char* prefetch, int64_t lines);
// The same for one bf16 pair panel [pairs, 48] and x as bf16 pairs, the fp32 sums unrounded (avx512_bf16).
void panel_block_bf16(const uint32_t* panel, const uint32_t* x_pairs, float* out, int64_t ldo, int64_t pairs,
                      int cols, int64_t rows, const char* prefetch, int64_t lines);
void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                       int64_t m, int64_t pairs, int64_t n);
void panel_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, float* out, int64_t m,
                       int64_t pairs, int64_t n);  // the fp32 sums, unrounded
void panel_linear_silu_fp32(const float* panels, const float* x, const float* bias, float* out, int64_t m,
                            int64_t k, int64_t inter);  // bias in the panels' order
void panel_linear_silu_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t inter);
// The same GEMMs with 8-lane FMAs (panel_linear_avx2.cc), where the CPU lacks AVX-512 (fp32) or avx512_bf16
// (bf16): the same sums per output, so fp32 gives the AVX-512 kernel's bits.
void panel_linear_fp32_avx2(const float* panels, const float* x, const float* bias, float* out, int64_t m, int64_t k,
                            int64_t n);
void panel_linear_bf16_avx2(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                            int64_t m, int64_t pairs, int64_t n);
// rows of x [rows, k] by one fp32 panel [k, 48] into out's columns [0, cols) (ldo apart), + bias, asking L2 for
// `lines` cache lines from `ahead` meanwhile: quant_linear_avx2's panel path.
void panel_block_fp32_avx2(const float* panel, const float* x, const float* bias, float* out, int64_t ldo, int64_t k,
                           int cols, int64_t rows, const char* ahead, int64_t lines);

// --- the greedy LM head (greedy_head.cc, AVX-512 + avx512_bf16) ---------------------------------------------
// A float32 head [N, K] -> its per-row error bounds [3, N] (|w - bf16(w)|, |bf16(w)|, |w|, rounded up).
at::Tensor greedy_bounds(const at::Tensor& w);
// A float32 head [N, K] -> (bf16 pair panels, greedy_bounds(w)).
std::tuple<at::Tensor, at::Tensor> pack_greedy_screen(const at::Tensor& w);
// argmax_j of h @ weight^T per row, exactly as the fp32 panel product would give it; -1 for rows with
// non-finite values (the caller decides those on full logits).
at::Tensor greedy_head(const at::Tensor& h, const at::Tensor& screen, const at::Tensor& bounds,
                       const at::Tensor& weight);
// The same for a head kept as packed GGUF blocks (quant_pack, n rows; bounds: quant_greedy_bounds): the screen's bf16 weights and the candidates' exact rows decoded from the blocks, so the ids are argmax
// of quant_linear's logits.
at::Tensor quant_greedy_head(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& bounds, int64_t n);
// greedy_bounds of a packed weight's dequantized rows, decoded one row at a time (AVX-512).
at::Tensor quant_greedy_bounds(const at::Tensor& packed, int64_t n);

// argmax per row of [rows, vocab] float32 / bf16 logits, ties to the lowest index as torch.argmax; -1 for rows
// holding a NaN (argmax_rows.cc).
at::Tensor argmax_rows(const at::Tensor& logits);

// --- norms, rotary, activation (norm_rotary.cc, activation.cc) ----------------------------------------------
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// (norm(x + residual) * weight, x + residual)
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                 const at::Tensor& weight, double eps);
// residual += x (rounded to its dtype), in place; returns norm(residual) * weight: add_rms_norm's bits.
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
// The same into out (x's shape, contiguous): decoder_layers reuses one buffer for every layer.
void add_rms_norm_into(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                       at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin);
// rotary's math on q and k in place: [T, heads, D] views whose heads are contiguous ([T, heads * D] rows, any row
// stride: column ranges of a qkv matrix).
void rotary_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin);
// rotary_, then k's and v's rows to slots[t] of the layer's caches (write_kv_rows), in one parallel loop.
void rotary_write_kv_(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                      const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache, const int64_t* slots);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
// The same from gated panels' column order ([rows, ceil(inter / 24) * 48], see pack_gated_panels): bit for bit
// silu_and_mul of the [gate | up] those columns hold.
at::Tensor silu_and_mul_gated(const at::Tensor& gate_up, int64_t inter);

// --- attention and the KV cache (paged_attention.cc, prefill_attention.cc, kv_write.cc) ---------------------
// One query row per entry of the batch, each over its own kv_lens[b] keys through block_table[b].
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_table, const at::Tensor& kv_lens, double scale);
// Causal attention of prefill rows of any lengths after any cached prefix (AVX-512).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, const at::Tensor& q_starts, const at::Tensor& kv_lens,
                             double scale);
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor layer_kv, const at::Tensor& slots);
// cache.view(-1, row)[slots[t]] = rows[t]; each row's elements contiguous, rows may be strided.
void write_kv_rows(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots);

// --- sampling (top_k_top_p.cc): the CPU twin of the NPU's top-k/top-p operator ------------------------------
at::Tensor apply_top_k_top_p(const at::Tensor& logits, const std::optional<at::Tensor>& k,
                             const std::optional<at::Tensor>& p);
// The draw (exponential_race.cc): per row argmax of p / -log(U) over [rows, vocab] float32 probabilities, U the
// counter-based uniform of (seed, step, token) from rtp_llm/device/random.py; tokens of probability 0 score 0.
at::Tensor exponential_race(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& steps);

// --- every decoder layer of a step in one call (decoder_layers.cc) -----------------------------------------
// q_starts given: the rows are prefills, attended by prefill_attention (block_table / kv_lens per sequence);
// else one paged_attention row per token (block_table / kv_lens per row). piece_rows > 0: the rows go through
// everything but the attention in pieces of that many (row-independent kernels only); 0: all at once.
// lora_*: the step's LoRA adapter groups (empty: none), their rows and per (layer, linear, group) the adapter's
// packed a, b and tiles (decoder_layers.cc, LoRADeltas).
// The names of a layer's weight slots and of its linear layers, in the order decoder_layers reads them.
std::vector<std::string> decoder_layer_slots();
std::vector<std::string> decoder_layer_linears();

std::tuple<at::Tensor, at::Tensor> decoder_layers(
    const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef sizes,
    const at::Tensor& kv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
    const at::Tensor& block_table, const at::Tensor& kv_lens, const std::optional<at::Tensor>& q_starts,
    int64_t num_heads, int64_t num_kv_heads, double eps, double scale, bool gated_mlp, int64_t piece_rows,
    const c10::List<at::Tensor>& lora_rows, const c10::List<std::optional<at::Tensor>>& lora_weights);

// --- LoRA deltas (lora_add.cc) ------------------------------------------------------------------------------
// For each group g: y[t] += (x[t] @ A^T) @ (B * scale)^T for t in rows[g] (None: every row), the adapter's weights
// packed in tiles of 8 columns (a, b, tiles: lora_add.cc, CpuOps.lora_pack); x and y [T, K] / [T, N] of one dtype
// (float32, bfloat16, float16), y rounded once. A row in two groups is refused.
void lora_add_(at::Tensor& y, const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& rows,
               const c10::List<at::Tensor>& a, const c10::List<at::Tensor>& b, const c10::List<at::Tensor>& tiles);

}  // namespace rtp_llm
