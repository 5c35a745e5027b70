// x [M, K] (float32) @ W^T (+ bias) for a weight kept in its GGUF blocks (quant_blocks.h): the dequantized model's
// math without its fp32 copy. Each weight is decoded to exactly gguf's float32 value and multiplied with the
// float32 activation; the activations are not quantized (unlike llama.cpp's kernels).
//
// Summation order, per output, for every row count, kernel and instruction set: sixteen lanes, lane l summing
// x[16c + l] * w[16c + l] over the 16-wide chunks c in order with fused multiply-adds, then the lanes in one fixed
// tree (l + l+8, + l+4, + l+2, + l+1), then the bias. So a row's result does not depend on how many rows share its
// step, and a CPU without AVX-512 gets the same bits as one with it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/quant_blocks.h"

namespace rtp_llm {
namespace {

using quant::Format;

float reduce_lanes(const float* a) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; ++i) s8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The portable kernel: one weight row decoded at a time, against every input row.
void quant_linear_portable(Format f, const uint8_t* w, int64_t block_bytes, const float* x, const float* bias,
                           float* out, int64_t m, int64_t k, int64_t n) {
    const int64_t per = quant::elements(f), blocks = k / per;
    parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> row(k);
        for (int64_t j = begin; j < end; ++j) {
            for (int64_t b = 0; b < blocks; ++b)
                quant::decode_block(f, w + (j * blocks + b) * block_bytes, row.data() + b * per);
            for (int64_t r = 0; r < m; ++r) {
                const float* xr = x + r * k;
                float acc[16] = {};
                for (int64_t c = 0; c < k; c += 16)
                    for (int l = 0; l < 16; ++l) acc[l] = std::fma(xr[c + l], row[c + l], acc[l]);
                out[r * n + j] = reduce_lanes(acc) + (bias ? bias[j] : 0.f);
            }
        }
    });
}

Format checked_format(const at::Tensor& w) {
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.is_contiguous(),
                "quant_linear: the weight must be contiguous uint8 blocks [N, blocks, block bytes]");
    const Format f = quant::format_of(w.size(2));
    TORCH_CHECK(f != Format::kUnknown, "quant_linear: no GGUF block format has ", w.size(2),
                " bytes (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144, Q5_K 176, Q6_K 210)");
    return f;
}

}  // namespace

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
    const Format f = checked_format(w);
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
                "quant_linear: x must be a float32 CPU matrix [M, K]");
    const int64_t n = w.size(0), k = w.size(1) * quant::elements(f);
    TORCH_CHECK(x.size(1) == k, "quant_linear: x has ", x.size(1), " columns, the weight ", k);
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "quant_linear: bias must be [N]");
        b = bias->to(at::kFloat).contiguous();
    }
    const auto xc = x.contiguous();
    auto out = at::empty({xc.size(0), n}, x.options());
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (xc.size(0) == 0 || n == 0) return out;
    if (cpu_avx512()) {
        quant_linear_avx512(static_cast<int>(f), w.data_ptr<uint8_t>(), w.size(2), xc.data_ptr<float>(), bp,
                            out.data_ptr<float>(), xc.size(0), k, n);
    } else {
        quant_linear_portable(f, w.data_ptr<uint8_t>(), w.size(2), xc.data_ptr<float>(), bp, out.data_ptr<float>(),
                              xc.size(0), k, n);
    }
    return out;
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

}  // namespace rtp_llm
