// SiLU-gated MLP activation: out = silu(gate) * up for gate_up = [gate | up] along the last dimension.
//
// Why: torch spends three passes and two temporaries on it (chunk views, silu, mul); this is one pass with a
// vectorised exp. The math is the reference's (rtp_llm/device/torch_ops.py: F.silu(gate) * up): silu = x / (1 + exp(-x)) in float32, and for bfloat16 the
// silu result is rounded to bf16 before the product and the product again, as the two aten ops round.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"

namespace rtp_llm {
namespace {

template <typename T>
void silu_mul_rows(const T* in, T* out, int64_t rows, int64_t inter) {
    parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const T* g = in + r * 2 * inter;
            const T* u = g + inter;
            T* o = out + r * inter;
            int64_t i = 0;
#ifdef __AVX2__
            const __m256 one = _mm256_set1_ps(1.f);
            for (; i + 8 <= inter; i += 8) {
                const __m256 x = vec::load8(g + i);
                const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, vec::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
                vec::store8(o + i, _mm256_mul_ps(vec::round_to(silu, g), vec::load8(u + i)));
            }
#endif
            for (; i < inter; ++i) {
                const float x = static_cast<float>(g[i]);
                o[i] = vec::to<T>(vec::round_as<T>(x / (1.f + std::exp(-x))) * static_cast<float>(u[i]));
            }
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

}  // namespace rtp_llm
