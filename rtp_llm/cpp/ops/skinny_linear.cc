// out = x @ W^T for a few rows x [M <= 8, K] and a weight W [N, K]: the decode GEMV of batch-1/small
// batches, which is memory-bound. Splits N across threads (at::parallel_for) and streams each weight
// row once for all M inputs with FMA-vectorised dot products. For larger M the BLAS GEMM is better
// and callers use it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace rtp_llm {
namespace {

constexpr int64_t kMaxRows = 8;

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& w) {
    TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "skinny_linear: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "skinny_linear: float32 only");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "skinny_linear: x [M, K], w [N, K]");
    TORCH_CHECK(x.size(0) <= kMaxRows, "skinny_linear: at most ", kMaxRows, " rows");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t m = xc.size(0), k = xc.size(1), n = wc.size(0);
    auto out = at::empty({m, n}, x.options());
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
            const float* row = wp + j * k;
            for (int64_t r = 0; r < m; ++r) {
                const float* xr = xp + r * k;
                float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                for (int64_t i = 0; i < k; ++i) acc += row[i] * xr[i];
                op[r * n + j] = acc;
            }
        }
    });
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rtp_llm, m) { m.def("skinny_linear(Tensor x, Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) { m.impl("skinny_linear", &skinny_linear); }

}  // namespace rtp_llm
