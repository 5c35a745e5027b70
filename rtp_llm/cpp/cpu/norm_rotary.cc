// Fused CPU element-wise ops: RMSNorm, residual add + RMSNorm, and rotate-half RoPE on q and k in place (with the
// KV cache write, for decoder_layers.cc).
//
// Why: at decode batch sizes each of these is several tiny aten ops per layer (pow, mean, add, rsqrt,
// mul, mul; slice, neg, cat, mul, mul, add per tensor), and dispatch overhead, not arithmetic, is what
// they cost: ~30 ops per layer.
//
// The math is the reference's (rtp_llm/device/torch_ops.py: rms_norm, apply_rotary) in float32, for float32
// and bfloat16 tensors. For bfloat16 every place where the reference's aten ops round to bfloat16 rounds
// here too (round-to-nearest-even, as c10::BFloat16 does), so the two agree up to the float32 summation
// order of the norm's mean.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"

#include <cmath>
#include <cstring>
#include <tuple>

namespace rtp_llm {
namespace {

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* op) {
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                    x.is_contiguous(),
                op, ": x must be a contiguous float32 or bfloat16 CPU tensor");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.dim() == 1 &&
                    weight.size(0) == x.size(-1),
                op, ": weight must be ", x.scalar_type(), " [", x.size(-1), "]");
}

#ifdef __AVX2__
// x rounded to T's precision, in registers: the identity for float, bf16 round-to-nearest-even for BFloat16 (the
// bits of vec::to; NaN payloads aside).
inline __m256 round8(__m256 x, const float*) { return x; }
inline __m256 round8(__m256 x, const c10::BFloat16*) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
#endif

// sum of in[i]^2 in float32: 8 lanes (two chains of them) summed in vec::hsum's tree, then a tail in order. The
// same function for every row, so a row's norm does not depend on the batch.
template <typename T>
inline float sum_squares(const T* in, int64_t n) {
    int64_t i = 0;
    float ss = 0.f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m256 v0 = vec::load8(in + i), v1 = vec::load8(in + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0), a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    if (i + 8 <= n) {
        const __m256 v0 = vec::load8(in + i);
        a0 = _mm256_fmadd_ps(v0, v0, a0), i += 8;
    }
    ss = vec::hsum(_mm256_add_ps(a0, a1));
#endif
    for (; i < n; ++i) {
        const float v = static_cast<float>(in[i]);
        ss += v * v;
    }
    return ss;
}

// out = w * T(in * rsqrt(mean(in^2) + eps)), the products in float32, rounded to T where the reference rounds.
template <typename T>
inline void norm_row(const T* in, const T* w, float eps, int64_t n, T* out) {
    const float r = 1.f / std::sqrt(sum_squares(in, n) / static_cast<float>(n) + eps);
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 rv = _mm256_set1_ps(r);
    for (; i + 8 <= n; i += 8)
        vec::store8(out + i, _mm256_mul_ps(vec::load8(w + i), round8(_mm256_mul_ps(vec::load8(in + i), rv), in)));
#endif
    for (; i < n; ++i)
        out[i] = vec::to<T>(static_cast<float>(w[i]) * vec::round_as<T>(static_cast<float>(in[i]) * r));
}

// s = T(x + res), then its norm as norm_row.
template <typename T>
inline void add_norm_row(const T* x, const T* res, const T* w, float eps, int64_t n, T* s, T* out) {
    int64_t i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8) vec::store8(s + i, _mm256_add_ps(vec::load8(x + i), vec::load8(res + i)));
#endif
    for (; i < n; ++i) s[i] = vec::to<T>(static_cast<float>(x[i]) + static_cast<float>(res[i]));
    norm_row<T>(s, w, eps, n, out);
}

// Rows per task: 16, so that a decode step's 17-64 rows are shared by the threads (serial, a step's norms left
// the other cores idle); one row is well under a microsecond of work.
constexpr int64_t kNormGrain = 16;

template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    const T *xp = x.data_ptr<T>(), *wp = weight.data_ptr<T>();
    T* op = out.data_ptr<T>();
    parallel_for(0, rows, kNormGrain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) norm_row<T>(xp + r * n, wp, static_cast<float>(eps), n, op + r * n);
    });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_rows(x, weight, "rms_norm");
    auto out = at::empty_like(x);
    if (x.scalar_type() == at::kFloat)
        rms_norm_rows<float>(x, weight, eps, out);
    else
        rms_norm_rows<c10::BFloat16>(x, weight, eps, out);
    return out;
}

namespace {

template <typename T>
void add_rms_norm_rows(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                       at::Tensor& out, at::Tensor& sum) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    const T *xp = x.data_ptr<T>(), *rp = residual.data_ptr<T>(), *wp = weight.data_ptr<T>();
    T *sp = sum.data_ptr<T>(), *op = out.data_ptr<T>();
    parallel_for(0, rows, kNormGrain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
            add_norm_row<T>(xp + r * n, rp + r * n, wp, static_cast<float>(eps), n, sp + r * n, op + r * n);
    });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                 const at::Tensor& weight, double eps) {
    check_rows(x, weight, "add_rms_norm");
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() &&
                    residual.is_contiguous(),
                "add_rms_norm: residual must match x");
    auto sum = at::empty_like(x);
    auto out = at::empty_like(x);
    if (x.scalar_type() == at::kFloat)
        add_rms_norm_rows<float>(x, residual, weight, eps, out, sum);
    else
        add_rms_norm_rows<c10::BFloat16>(x, residual, weight, eps, out, sum);
    return {out, sum};
}

at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
    auto out = at::empty_like(x);
    add_rms_norm_into(x, residual, weight, eps, out);
    return out;
}

void add_rms_norm_into(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                       at::Tensor& out) {
    check_rows(x, weight, "add_rms_norm_");
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() &&
                    residual.is_contiguous(),
                "add_rms_norm_: residual must match x");
    TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type() && out.is_contiguous(),
                "add_rms_norm_: out must match x");
    // add_norm_row reads x[i] and residual[i] before it writes the sum to residual[i]: in place is safe.
    if (x.scalar_type() == at::kFloat)
        add_rms_norm_rows<float>(x, residual, weight, eps, out, residual);
    else
        add_rms_norm_rows<c10::BFloat16>(x, residual, weight, eps, out, residual);
}

namespace {

// x [T, heads, D] in place (heads contiguous within a row, rows x.stride(0) apart); cos/sin [T, D] (the halves
// repeat, as the reference builds them). Reference: x * cos + rotate_half(x) * sin, each product and the sum
// rounded to T.
template <typename T>
void rotate_token(T* xrow, int64_t heads, int64_t dim, const T* c, const T* s) {
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        T* v = xrow + h * dim;
        int64_t i = 0;
#ifdef __AVX2__
        for (; i + 8 <= half; i += 8) {
            const __m256 a = vec::load8(v + i), bb = vec::load8(v + i + half);
            const __m256 c0 = vec::load8(c + i), c1 = vec::load8(c + i + half);
            const __m256 s0 = vec::load8(s + i), s1 = vec::load8(s + i + half);
            const __m256 neg = _mm256_set1_ps(-0.f);
            vec::store8(v + i, _mm256_add_ps(round8(_mm256_mul_ps(a, c0), v),
                                             round8(_mm256_mul_ps(_mm256_xor_ps(bb, neg), s0), v)));
            vec::store8(v + i + half, _mm256_add_ps(round8(_mm256_mul_ps(bb, c1), v),
                                                    round8(_mm256_mul_ps(a, s1), v)));
        }
#endif
        for (; i < half; ++i) {
            const float a = static_cast<float>(v[i]), bb = static_cast<float>(v[i + half]);
            const float c0 = static_cast<float>(c[i]), c1 = static_cast<float>(c[i + half]);
            const float s0 = static_cast<float>(s[i]), s1 = static_cast<float>(s[i + half]);
            v[i] = vec::to<T>(vec::round_as<T>(a * c0) + vec::round_as<T>(-bb * s0));
            v[i + half] = vec::to<T>(vec::round_as<T>(bb * c1) + vec::round_as<T>(a * s1));
        }
    }
}

template <typename T>
void rotate_one(at::Tensor& x, const T* cp, const T* sp) {
    const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), row = x.stride(0);
    T* xp = x.data_ptr<T>();
    parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) rotate_token(xp + t * row, heads, dim, cp + t * dim, sp + t * dim);
    });
}

// rotary_ on q and k, then write_kv_rows of k and v, token by token in one parallel loop: the same bits, one
// loop instead of three (a decode step's are microseconds each, so their joins and the serial row copies were
// a measurable share of a layer).
template <typename T>
void rotate_write_kv(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const T* cp, const T* sp, at::Tensor& k_cache,
                     at::Tensor& v_cache, const int64_t* slots) {
    const int64_t tokens = q.size(0), dim = q.size(2), q_heads = q.size(1), kv_heads = k.size(1);
    const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0), bytes = kv_heads * dim * sizeof(T);
    T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>();
    const T* vp = v.data_ptr<T>();
    char *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
    parallel_for(0, tokens, 16, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            const T *c = cp + t * dim, *s = sp + t * dim;
            rotate_token(qp + t * q_row, q_heads, dim, c, s);
            rotate_token(kp + t * k_row, kv_heads, dim, c, s);
            std::memcpy(kc + slots[t] * bytes, kp + t * k_row, bytes);
            std::memcpy(vc + slots[t] * bytes, vp + t * v_row, bytes);
        }
    });
}

}  // namespace

namespace {

void check_rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                  const char* op) {
    const auto dtype = cos.scalar_type();
    TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && sin.scalar_type() == dtype &&
                    sin.sizes() == cos.sizes() && cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous(),
                op, ": cos/sin must be contiguous float32 or bfloat16 [T, D]");
    for (const auto* t : {&q, &k}) {
        TORCH_CHECK(t->scalar_type() == dtype && t->dim() == 3 && t->size(0) == cos.size(0) &&
                        t->size(2) == cos.size(1) && t->size(2) % 2 == 0,
                    op, ": q/k must be ", dtype, " [T, heads, D] with even D matching cos [T, D]");
    }
}

void rotate_both(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
    if (cos.scalar_type() == at::kFloat) {
        rotate_one<float>(q, cos.data_ptr<float>(), sin.data_ptr<float>());
        rotate_one<float>(k, cos.data_ptr<float>(), sin.data_ptr<float>());
    } else {
        using B = c10::BFloat16;
        rotate_one<B>(q, cos.data_ptr<B>(), sin.data_ptr<B>());
        rotate_one<B>(k, cos.data_ptr<B>(), sin.data_ptr<B>());
    }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin) {
    check_rotary(q, k, cos, sin, "rotary");
    auto qo = q.clone(at::MemoryFormat::Contiguous);  // one copy, contiguous whatever the input strides
    auto ko = k.clone(at::MemoryFormat::Contiguous);
    rotate_both(qo, ko, cos, sin);
    return {qo, ko};
}

void rotary_write_kv_(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                      const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache, const int64_t* slots) {
    check_rotary(q, k, cos, sin, "rotary_write_kv_");
    for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q, &k, &v})
        TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2),
                    "rotary_write_kv_: q/k/v heads must be contiguous");
    TORCH_CHECK(v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type() && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && k_cache.scalar_type() == k.scalar_type() &&
                    v_cache.sizes() == k_cache.sizes() && k_cache.size(-2) == k.size(1) &&
                    k_cache.size(-1) == k.size(2),
                "rotary_write_kv_: v must match k, the caches [blocks, block_size, kv_heads, head_dim] in k's dtype");
    if (cos.scalar_type() == at::kFloat)
        rotate_write_kv<float>(q, k, v, cos.data_ptr<float>(), sin.data_ptr<float>(), k_cache, v_cache, slots);
    else
        rotate_write_kv<c10::BFloat16>(q, k, v, cos.data_ptr<c10::BFloat16>(), sin.data_ptr<c10::BFloat16>(),
                                       k_cache, v_cache, slots);
}

void rotary_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
    check_rotary(q, k, cos, sin, "rotary_");
    for (const auto* t : {&q, &k})
        TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "rotary_: q/k heads must be contiguous");
    rotate_both(q, k, cos, sin);
}

}  // namespace rtp_llm
