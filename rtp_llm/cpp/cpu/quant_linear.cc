// x [M, K] (float32; bfloat16 widened to it) @ W^T (+ bias) for a weight kept in its GGUF blocks, repacked at load
// (quant_pack; layout in quant_packed.h): the dequantized model's math without its fp32 copy. Each weight is
// decoded to exactly gguf's float32 value and multiplied with the float32 activation; the activations are not
// quantized (unlike llama.cpp's kernels).
//
// Summation order, per output, for every row count, kernel and instruction set: the fp32 panels' (panel_linear.cc):
// one fused multiply-add chain over k in order from zero, then + bias. So a row's result does not depend on how many
// rows share its step, a CPU without AVX-512 gets the same bits as one with it, and the product equals
// panel_linear on the dequantized matrix bit for bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_packed.h"

namespace rtp_llm {
namespace {

using quant::Format;

Format checked_format(const at::Tensor& w) {
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.is_contiguous(),
                "quant_pack / quant_dequantize: the weight must be contiguous uint8 blocks [N, blocks, block bytes]");
    const Format f = quant::format_of(w.size(2));
    TORCH_CHECK(f != Format::kUnknown, "quant_pack / quant_dequantize: no GGUF block format has ", w.size(2),
                " bytes (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144, Q5_K 176, Q6_K 210)");
    return f;
}

Format checked_packed(const at::Tensor& w, int64_t n, const char* op) {
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.is_contiguous(), op,
                ": the weight must be quant_pack's contiguous uint8 [ceil(N / 16), blocks, 16 x row bytes]");
    const Format f = quant::packed_format_of(w.size(2));
    TORCH_CHECK(f != Format::kUnknown, op, ": ", w.size(2),
                " bytes per group-block is no packed format's (Q8_0 544, Q4_0 288, Q4_1 320, Q5_0 352, Q5_1 384, "
                "Q4_K 2368, Q5_K 2880, Q6_K 3360); pack the file's blocks with quant_pack");
    TORCH_CHECK(n > (w.size(0) - 1) * quant::kLanes && n <= w.size(0) * quant::kLanes, op, ": n = ", n,
                " rows do not match ", w.size(0), " groups of 16");
    return f;
}

}  // namespace

// This thread's decoded panel, kept between calls (a fresh 100-300 KB buffer per call would be mapped and faulted
// in each time).
float* quant_thread_panel(int64_t floats) {
    struct Aligned {  // 64-byte aligned, so that a vector store is one cache line
        float* p = nullptr;
        int64_t size = 0;
        ~Aligned() { std::free(p); }
    };
    thread_local Aligned panel;
    if (panel.size < floats) {
        std::free(panel.p);
        panel.p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((floats * 4 + 63) / 64 * 64)));
        TORCH_CHECK(panel.p != nullptr, "quant_linear: no memory for a ", floats * 4, "-byte panel");
        std::memset(panel.p, 0, static_cast<size_t>(floats) * 4);
        panel.size = floats;
    }
    return panel.p;
}

int quant_packed_format(const at::Tensor& w, int64_t n, const char* op) {
    return static_cast<int>(checked_packed(w, n, op));
}

int64_t quant_packed_elements(int format) { return quant::elements(static_cast<Format>(format)); }

at::Tensor quant_pack(const std::vector<at::Tensor>& parts) {
    TORCH_CHECK(!parts.empty(), "quant_pack: no blocks given");
    const Format f = checked_format(parts[0]);
    const int64_t blocks = parts[0].size(1), bytes = parts[0].size(2);
    std::vector<const uint8_t*> rows;  // the rows of the parts, in order
    for (const auto& part : parts) {
        TORCH_CHECK(checked_format(part) == f && part.size(1) == blocks,
                    "quant_pack: the parts must share their format and columns (", parts[0].sizes(), " vs ",
                    part.sizes(), ")");
        for (int64_t r = 0; r < part.size(0); ++r) rows.push_back(part.data_ptr<uint8_t>() + r * blocks * bytes);
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    // Q4_1 decodes from slot words where every block's slot constants are exact (quant_packed.h), else the tensor
    // is packed as Q5_1 (its blocks with zero fifth bits: the same values, 1.2x the bytes)
    Format pf = f;
    if (f == Format::kQ4_1) {
        std::atomic<bool> exact{true};
        parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end && exact.load(std::memory_order_relaxed); ++r)
                for (int64_t b = 0; b < blocks; ++b)
                    if (!quant::slots_exact(rows[r] + b * bytes)) exact.store(false, std::memory_order_relaxed);
        });
        if (!exact.load()) pf = Format::kQ5_1;
    }
    const int64_t groups = (n + quant::kLanes - 1) / quant::kLanes, packed = quant::packed_layout(pf).bytes;
    auto out = at::zeros({groups, blocks, packed}, parts[0].options());
    uint8_t* dst = out.data_ptr<uint8_t>();
    std::atomic<int64_t> bad{-1};  // a block (row * blocks + b) whose scales are not finite
    parallel_for(0, groups * blocks, 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t g = i / blocks, b = i % blocks;
            for (int r = 0; r < quant::kLanes && g * quant::kLanes + r < n; ++r) {
                const uint8_t* block = rows[g * quant::kLanes + r] + b * bytes;
                if (!quant::finite_scales(f, block)) bad.store((g * quant::kLanes + r) * blocks + b);
                quant::pack_row(pf, f, block, r, dst + i * packed);
            }
        }
    });
    const int64_t at = bad.load();
    TORCH_CHECK(at < 0, "quant_pack: row ", at / blocks, " block ", at % blocks,
                " has a non-finite scale (inf or NaN): the blocks are corrupt");
    return out;
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, int64_t n) {
    TORCH_CHECK(x.dim() == 2, "quant_linear: x must be a float32 or bfloat16 CPU matrix [M, K]");
    auto out = at::empty({x.size(0), n}, x.options());
    quant_linear_out(x, w, bias, n, out);
    return out;
}

void quant_linear_out(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, int64_t n,
                      at::Tensor& out) {
    const Format f = checked_packed(w, n, "quant_linear");
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                    x.dim() == 2,
                "quant_linear: x must be a float32 or bfloat16 CPU matrix [M, K]");
    TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n &&
                    out.scalar_type() == x.scalar_type(),
                "quant_linear: out must be a contiguous [", x.size(0), ", ", n, "] tensor in x's dtype");
    if (x.scalar_type() == at::kBFloat16) {
        // bf16 activations widen exactly, meet the same float32 weights and sums, and the result (bias included)
        // rounds to bf16 once, as the bf16 panels round theirs. The widening is O(M K) beside the O(M N K) product.
        out.copy_(quant_linear(x.to(at::kFloat), w, bias, n));
        return;
    }
    const int64_t k = w.size(1) * quant::elements(f);
    TORCH_CHECK(x.size(1) == k, "quant_linear: x has ", x.size(1), " columns, the weight ", k);
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "quant_linear: bias must be [", n, "]");
        b = bias->to(at::kFloat).contiguous();
    }
    const auto xc = x.contiguous();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (xc.size(0) == 0 || n == 0) return;
    if (cpu_avx512()) {
        quant_linear_avx512(static_cast<int>(f), w.data_ptr<uint8_t>(), xc.data_ptr<float>(), bp,
                            out.data_ptr<float>(), xc.size(0), k, n);
    } else {
        quant_linear_avx2(static_cast<int>(f), w.data_ptr<uint8_t>(), xc.data_ptr<float>(), bp,
                          out.data_ptr<float>(), xc.size(0), k, n);
    }
}

at::Tensor quant_linear_silu(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                             int64_t inter) {
    constexpr int64_t half = kPanelCols / 2;
    TORCH_CHECK(inter > 0, "quant_linear_silu: the activation's width must be positive, got ", inter);
    const int64_t np = (inter + half - 1) / half;
    const Format f = checked_packed(w, np * kPanelCols, "quant_linear_silu");
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                    x.dim() == 2,
                "quant_linear_silu: x must be a float32 or bfloat16 CPU matrix [M, K]");
    const int64_t k = w.size(1) * quant::elements(f);
    TORCH_CHECK(x.size(1) == k, "quant_linear_silu: x has ", x.size(1), " columns, the weight ", k);
    const at::Tensor b = gated_bias(bias, inter, "quant_linear_silu");
    if (x.scalar_type() == at::kFloat && cpu_avx512()) {
        const auto xc = x.contiguous();
        auto out = at::empty({x.size(0), inter}, x.options());
        quant_linear_silu_avx512(static_cast<int>(f), w.data_ptr<uint8_t>(), xc.data_ptr<float>(),
                                 b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>(), x.size(0), k,
                                 inter);
        return out;
    }
    // [gate | up] from the interleaved rows, then the activation: the epilogue's bits (it rounds as silu_and_mul)
    const int64_t m = x.size(0);
    const auto y = quant_linear(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, np * kPanelCols);
    return silu_and_mul(y.view({m, np, 2, half}).transpose(1, 2).reshape({m, 2, np * half}).narrow(2, 0, inter)
                            .reshape({m, 2 * inter}));
}

at::Tensor quant_dequantize(const at::Tensor& w) {
    const Format f = checked_format(w);
    const int64_t n = w.size(0), blocks = w.size(1), bytes = w.size(2), per = quant::elements(f);
    auto out = at::empty({n, blocks * per}, at::TensorOptions().dtype(at::kFloat));
    const uint8_t* src = w.data_ptr<uint8_t>();
    float* dst = out.data_ptr<float>();
    parallel_for(0, n * blocks, 1024, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) quant::decode_block(f, src + i * bytes, dst + i * per);
    });
    return out;
}

at::Tensor quant_packed_rows(const at::Tensor& w, const at::Tensor& rows, int64_t n) {
    const Format f = checked_packed(w, n, "quant_packed_rows");
    TORCH_CHECK(rows.scalar_type() == at::kLong, "quant_packed_rows: rows must be int64 indices");
    const auto ids = rows.reshape({-1}).contiguous();
    const int64_t count = ids.numel(), blocks = w.size(1), per = quant::elements(f), bytes = w.size(2);
    const int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i)
        TORCH_CHECK(id[i] >= 0 && id[i] < n, "quant_packed_rows: row ", id[i], " is out of range [0, ", n, ")");
    auto out = at::empty({count, blocks * per}, at::TensorOptions().dtype(at::kFloat));
    const uint8_t* src = w.data_ptr<uint8_t>();
    float* dst = out.data_ptr<float>();
    parallel_for(0, count * blocks, 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t row = id[i / blocks], b = i % blocks;
            const uint8_t* g = src + ((row / quant::kLanes) * blocks + b) * bytes;
            for (int e = 0; e < per; ++e)
                dst[i * per + e] = quant::packed_value(f, g, static_cast<int>(row % quant::kLanes), e);
        }
    });
    std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
    shape.push_back(blocks * per);
    return out.view(shape);
}

}  // namespace rtp_llm
