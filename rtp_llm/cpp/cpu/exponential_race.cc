// The sampler's draw on the CPU: argmax over tokens of p / E, E = -log(U), U the counter-based uniform of
// rtp_llm/device/random.py (same integer hash, same float32 rounding), tokens of probability 0 scoring 0.
//
// Why: the torch version hashes, takes a log of and divides every one of the vocabulary's entries in separate
// passes over [rows, vocab] tensors. Here one pass per row hashes each candidate and skips the log wherever the
// bound -log(U) >= 1 - U shows the token cannot beat the best so far; a handful of logs per row remain.
// The log is float64 rounded to float32 (the torch version's float32 log may differ in its last bit), so the two
// agree on the token except where two scores are within one float32 step.
#include <ATen/ATen.h>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace rtp_llm {
namespace {

constexpr uint64_t kM1 = 0xbf58476d1ce4e5b9ULL, kM2 = 0x94d049bb133111ebULL;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL, kStep = 0x632BE59BD9B4E019ULL;

inline uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * kM1;
    x = (x ^ (x >> 27)) * kM2;
    return x ^ (x >> 31);
}

// U of token index i for a row whose hash base is `base`, rounded exactly as random.uniform rounds it
inline float uniform_at(uint64_t base, uint64_t i) {
    const uint64_t x = mix(base + i * kGolden);
    return (static_cast<float>((x >> 40) & 0xFFFFFF) + 0.5f) * (1.0f / 16777216.0f);
}

int64_t row_race(const float* p, int64_t vocab, int64_t seed, int64_t step) {
    const uint64_t base = mix(static_cast<uint64_t>(seed) * kGolden + static_cast<uint64_t>(step) * kStep);
    float best = -std::numeric_limits<float>::infinity();
    int64_t best_i = 0;
    for (int64_t i = 0; i < vocab; ++i) {
        const float pi = p[i];
        if (!(pi > 0.0f)) {  // probability 0 (or NaN): scores 0, and needs no uniform
            if (0.0f > best) best = 0.0f, best_i = i;
            continue;
        }
        const float u = uniform_at(base, static_cast<uint64_t>(i));
        // p / -log(U) <= p / (1 - U); the margin covers every rounding of both sides
        if (pi * 1.00001f < best * (1.0f - u)) continue;
        const float e = -static_cast<float>(std::log(static_cast<double>(u)));
        const float r = pi / e;  // U = 1: e = -0, r = -inf, as in the torch version
        if (r > best) best = r, best_i = i;  // strictly greater: ties keep the lowest index
    }
    return best_i;
}

}  // namespace

at::Tensor exponential_race(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& steps) {
    TORCH_CHECK(probs.device().is_cpu() && probs.dim() == 2 && probs.scalar_type() == at::kFloat,
                "probs must be a 2-D float32 CPU tensor");
    const int64_t rows = probs.size(0), vocab = probs.size(1);
    auto p = probs.contiguous();
    auto s = seeds.to(at::kLong).contiguous(), t = steps.to(at::kLong).contiguous();
    TORCH_CHECK(s.numel() == rows && t.numel() == rows, "seeds and steps must have one entry per row");
    auto out = at::empty({rows}, at::kLong);
    const float* pp = p.data_ptr<float>();
    const int64_t *sp = s.data_ptr<int64_t>(), *tp = t.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) o[r] = row_race(pp + r * vocab, vocab, sp[r], tp[r]);
    });
    return out;
}

}  // namespace rtp_llm
