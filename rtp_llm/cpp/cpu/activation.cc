// SiLU-gated MLP activation: out = silu(gate) * up for gate_up = [gate | up] along the last dimension.
//
// Why: torch spends three passes and two temporaries on it (chunk views, silu, mul); this is one pass with a
// vectorised exp. The math is the reference's (rtp_llm/device/torch_ops.py: F.silu(gate) * up): silu = x / (1 + exp(-x)) in float32, and for bfloat16 the
// silu result is rounded to bf16 before the product and the product again, as the two aten ops round.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"

namespace rtp_llm {
namespace {

// out[i] = silu(g[i]) * u[i] for i < n: [0, n_vec) eight at a time (n_vec a multiple of 8), the rest one at a time.
// Which path an element takes depends only on its index in [gate | up] (silu_and_mul_gated keeps that), so a
// value is the same bits in either layout.
template <typename T>
inline void silu_mul_span(const T* g, const T* u, T* o, int64_t n_vec, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 one = _mm256_set1_ps(1.f);
    for (; i < n_vec; i += 8) {
        const __m256 x = vec::load8(g + i);
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, vec::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        vec::store8(o + i, _mm256_mul_ps(vec::round_to(silu, g), vec::load8(u + i)));
    }
#endif
    for (; i < n; ++i) {
        const float x = static_cast<float>(g[i]);
        o[i] = vec::to<T>(vec::round_as<T>(x / (1.f + std::exp(-x))) * static_cast<float>(u[i]));
    }
}

#ifdef __AVX2__
constexpr int64_t kVecWidth = 8;
#else
constexpr int64_t kVecWidth = 1 << 30;  // no vector path: every element scalar
#endif

template <typename T>
void silu_mul_rows(const T* in, T* out, int64_t rows, int64_t inter) {
    const int64_t n_vec = inter / kVecWidth * kVecWidth;
    parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            silu_mul_span(in + r * 2 * inter, in + r * 2 * inter + inter, out + r * inter, n_vec, inter);
    });
}

// The same from gated panels' column order: per block p of 24, [gate 24p..24p+23, up 24p..24p+23].
template <typename T>
void silu_mul_gated_rows(const T* in, T* out, int64_t rows, int64_t inter) {
    const int64_t blocks = (inter + 23) / 24, n_vec = inter / kVecWidth * kVecWidth;
    parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            for (int64_t p = 0; p < blocks; ++p) {
                const int64_t i0 = p * 24, len = std::min<int64_t>(24, inter - i0);
                const T* g = in + r * blocks * 48 + p * 48;
                silu_mul_span(g, g + 24, out + r * inter + i0, std::clamp<int64_t>(n_vec - i0, 0, len), len);
            }
    });
}

}  // namespace

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
    const auto dtype = gate_up.scalar_type();
    TORCH_CHECK(gate_up.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16),
                "silu_and_mul: float32 or bfloat16 CPU tensor expected, got ", dtype);
    TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "silu_and_mul: last dimension must be even, got ",
                gate_up.sizes());
    auto x = gate_up.contiguous();
    const int64_t inter = x.size(-1) / 2, rows = x.numel() / std::max<int64_t>(1, x.size(-1));
    auto sizes = x.sizes().vec();
    sizes.back() = inter;
    auto out = at::empty(sizes, x.options());
    if (dtype == at::kFloat)
        silu_mul_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), rows, inter);
    else
        silu_mul_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, inter);
    return out;
}

at::Tensor silu_and_mul_gated(const at::Tensor& gate_up, int64_t inter) {
    const auto dtype = gate_up.scalar_type();
    const int64_t blocks = (inter + 23) / 24;
    TORCH_CHECK(gate_up.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                    gate_up.dim() == 2 && gate_up.size(1) == blocks * 48 && gate_up.is_contiguous(),
                "silu_and_mul_gated: contiguous float32 or bfloat16 [rows, ", blocks * 48, "] expected, got ",
                gate_up.sizes());
    const int64_t rows = gate_up.size(0);
    auto out = at::empty({rows, inter}, gate_up.options());
    if (dtype == at::kFloat)
        silu_mul_gated_rows<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, inter);
    else
        silu_mul_gated_rows<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows,
                                           inter);
    return out;
}

}  // namespace rtp_llm
