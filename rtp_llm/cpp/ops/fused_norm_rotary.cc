// Fused CPU element-wise ops: RMSNorm, residual add + RMSNorm, and rotate-half RoPE on q and k in place.
//
// Why: at decode batch sizes each of these is several tiny aten ops per layer (pow, mean, add, rsqrt,
// mul, mul; slice, neg, cat, mul, mul, add per tensor), and dispatch overhead, not arithmetic, is what
// they cost: ~30 ops per layer, about a quarter of a batch-1 decode step on this machine kind. The
// math is the reference's (rtp_llm/layers/norm.py, rtp_llm/layers/rotary.py) in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace rtp_llm {
namespace {

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* op) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), op,
                ": x must be a contiguous float32 CPU tensor");
    TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.dim() == 1 &&
                    weight.size(0) == x.size(-1),
                op, ": weight must be float32 [", x.size(-1), "]");
}

inline void norm_row(const float* in, const float* w, float eps, int64_t n, float* out) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += in[i] * in[i];
    const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (in[i] * r);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_rows(x, weight, "rms_norm");
    const int64_t n = x.size(-1), rows = x.numel() / n;
    auto out = at::empty_like(x);
    const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, rows, 64, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) norm_row(xp + r * n, wp, static_cast<float>(eps), n, op + r * n);
    });
    return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                 const at::Tensor& weight, double eps) {
    check_rows(x, weight, "add_rms_norm");
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
                "add_rms_norm: residual must match x");
    const int64_t n = x.size(-1), rows = x.numel() / n;
    auto sum = at::empty_like(x);
    auto out = at::empty_like(x);
    const float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>(), *wp = weight.data_ptr<float>();
    float *sp = sum.data_ptr<float>(), *op = out.data_ptr<float>();
    at::parallel_for(0, rows, 64, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            float* s = sp + r * n;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) s[i] = xp[r * n + i] + rp[r * n + i];
            norm_row(s, wp, static_cast<float>(eps), n, op + r * n);
        }
    });
    return {out, sum};
}

// x [T, heads, D] in place; cos/sin [T, D] (the halves repeat, as the reference builds them).
void rotate_one(at::Tensor& x, const float* cp, const float* sp) {
    const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
    float* xp = x.data_ptr<float>();
    at::parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            const float *c = cp + t * dim, *s = sp + t * dim;
            for (int64_t h = 0; h < heads; ++h) {
                float* v = xp + (t * heads + h) * dim;
#pragma omp simd
                for (int64_t i = 0; i < half; ++i) {
                    const float a = v[i], bb = v[i + half];
                    v[i] = a * c[i] - bb * s[i];
                    v[i + half] = bb * c[i + half] + a * s[i + half];
                }
            }
        }
    });
}

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin) {
    for (const auto* t : {&q, &k}) {
        TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 3 && t->size(0) == cos.size(0) &&
                        t->size(2) == cos.size(1) && t->size(2) % 2 == 0,
                    "rotary: q/k must be float32 [T, heads, D] with even D matching cos [T, D]");
    }
    TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                    sin.is_contiguous(),
                "rotary: cos/sin must be contiguous float32 [T, D]");
    auto qo = q.clone(at::MemoryFormat::Contiguous);  // one copy, contiguous whatever the input strides
    auto ko = k.clone(at::MemoryFormat::Contiguous);
    rotate_one(qo, cos.data_ptr<float>(), sin.data_ptr<float>());
    rotate_one(ko, cos.data_ptr<float>(), sin.data_ptr<float>());
    return {qo, ko};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rtp_llm, m) {
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rtp_llm, CPU, m) {
    m.impl("rms_norm", &rms_norm);
    m.impl("add_rms_norm", &add_rms_norm);
    m.impl("rotary", &rotary);
}

}  // namespace rtp_llm
