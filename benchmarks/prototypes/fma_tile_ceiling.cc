// What one core's float32 FMA tile can reach here (benchmarks/README.md, "What bounds Qwen2.5-Coder's W"): the
// FMA peak (24 independent vfmadd231ps chains, no loads), and panel_linear.cc's micro-kernel shape (8 rows x 48
// columns, 24 zmm accumulators; per k: 3 panel vectors, 8 broadcasts of x, 24 FMAs), written two ways: with
// intrinsics as panel_linear.cc writes it (GCC schedules it), and as hand-written assembly with the broadcasts in
// registers. The panel is 64-byte aligned, as the engine's are. Stand-alone, not part of the build:
//
//   g++ -O3 -mavx2 -mfma benchmarks/prototypes/fma_tile_ceiling.cc -o /tmp/fma_tile_ceiling
//   /tmp/fma_tile_ceiling 896     # K (896: Qwen2.5-0.5B's hidden size; 128: a panel that fits L1)
//
// Prints GFLOP/s of one thread for each, best of 5, three rounds; both tiles' sums are checked equal (same order).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

namespace {

constexpr int kRows = 8, kCols = 48;

AVX512 __attribute__((noinline)) void tile_intrinsics(const float* __restrict pan, const float* __restrict x,
                                                      int64_t k, float* out) {
    __m512 acc[kRows][3];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; ++i) {
        const float* w = pan + i * kCols;
        const __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16), w2 = _mm512_load_ps(w + 32);
        for (int r = 0; r < kRows; ++r) {
            const __m512 xv = _mm512_set1_ps(x[r * k + i]);
            acc[r][0] = _mm512_fmadd_ps(w0, xv, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(w1, xv, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(w2, xv, acc[r][2]);
        }
    }
    for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < 3; ++c) _mm512_storeu_ps(out + r * kCols + 16 * c, acc[r][c]);
}

// zmm0-23 accumulators (row r: 3r .. 3r + 2), zmm24-26 the panel row, zmm27-31 broadcasts; x rows r and r + 4
// addressed from two bases with the row stride s (scale 1, 2) and 3 s.
#define RTP_BCAST(addr, b) "vbroadcastss " addr ", %%zmm" #b "\n\t"
#define RTP_FMAS(b, a0, a1, a2)                 \
    "vfmadd231ps %%zmm" #b ", %%zmm24, %%zmm" #a0 "\n\t" \
    "vfmadd231ps %%zmm" #b ", %%zmm25, %%zmm" #a1 "\n\t" \
    "vfmadd231ps %%zmm" #b ", %%zmm26, %%zmm" #a2 "\n\t"
#define RTP_STORE(a, off) "vmovups %%zmm" #a ", " #off "(%[o])\n\t"

AVX512 __attribute__((noinline)) void tile_asm(const float* pan, const float* x, int64_t k, float* out) {
    const float* x0 = x;
    const float* x4 = x + 4 * k;
    const int64_t s = k * 4, s3 = 3 * k * 4;
    int64_t n = k;
    asm volatile(
        "vxorps %%zmm0, %%zmm0, %%zmm0\n\t"
        "vmovaps %%zmm0, %%zmm1\n\t vmovaps %%zmm0, %%zmm2\n\t vmovaps %%zmm0, %%zmm3\n\t"
        "vmovaps %%zmm0, %%zmm4\n\t vmovaps %%zmm0, %%zmm5\n\t vmovaps %%zmm0, %%zmm6\n\t"
        "vmovaps %%zmm0, %%zmm7\n\t vmovaps %%zmm0, %%zmm8\n\t vmovaps %%zmm0, %%zmm9\n\t"
        "vmovaps %%zmm0, %%zmm10\n\t vmovaps %%zmm0, %%zmm11\n\t vmovaps %%zmm0, %%zmm12\n\t"
        "vmovaps %%zmm0, %%zmm13\n\t vmovaps %%zmm0, %%zmm14\n\t vmovaps %%zmm0, %%zmm15\n\t"
        "vmovaps %%zmm0, %%zmm16\n\t vmovaps %%zmm0, %%zmm17\n\t vmovaps %%zmm0, %%zmm18\n\t"
        "vmovaps %%zmm0, %%zmm19\n\t vmovaps %%zmm0, %%zmm20\n\t vmovaps %%zmm0, %%zmm21\n\t"
        "vmovaps %%zmm0, %%zmm22\n\t vmovaps %%zmm0, %%zmm23\n\t"
        "1:\n\t"
        "vmovaps (%[p]), %%zmm24\n\t vmovaps 64(%[p]), %%zmm25\n\t vmovaps 128(%[p]), %%zmm26\n\t"
        RTP_BCAST("(%[x0])", 27) RTP_FMAS(27, 0, 1, 2)
        RTP_BCAST("(%[x0],%[s])", 28) RTP_FMAS(28, 3, 4, 5)
        RTP_BCAST("(%[x0],%[s],2)", 29) RTP_FMAS(29, 6, 7, 8)
        RTP_BCAST("(%[x0],%[s3])", 30) RTP_FMAS(30, 9, 10, 11)
        RTP_BCAST("(%[x4])", 31) RTP_FMAS(31, 12, 13, 14)
        RTP_BCAST("(%[x4],%[s])", 27) RTP_FMAS(27, 15, 16, 17)
        RTP_BCAST("(%[x4],%[s],2)", 28) RTP_FMAS(28, 18, 19, 20)
        RTP_BCAST("(%[x4],%[s3])", 29) RTP_FMAS(29, 21, 22, 23)
        "add $192, %[p]\n\t add $4, %[x0]\n\t add $4, %[x4]\n\t dec %[n]\n\t jnz 1b\n\t"
        RTP_STORE(0, 0) RTP_STORE(1, 64) RTP_STORE(2, 128) RTP_STORE(3, 192) RTP_STORE(4, 256) RTP_STORE(5, 320)
        RTP_STORE(6, 384) RTP_STORE(7, 448) RTP_STORE(8, 512) RTP_STORE(9, 576) RTP_STORE(10, 640)
        RTP_STORE(11, 704) RTP_STORE(12, 768) RTP_STORE(13, 832) RTP_STORE(14, 896) RTP_STORE(15, 960)
        RTP_STORE(16, 1024) RTP_STORE(17, 1088) RTP_STORE(18, 1152) RTP_STORE(19, 1216) RTP_STORE(20, 1280)
        RTP_STORE(21, 1344) RTP_STORE(22, 1408) RTP_STORE(23, 1472)
        : [p] "+r"(pan), [x0] "+r"(x0), [x4] "+r"(x4), [n] "+r"(n)
        : [s] "r"(s), [s3] "r"(s3), [o] "r"(out)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
}

// The FMA ports alone: 24 independent chains per iteration, k iterations (the same FLOP count as a tile).
AVX512 __attribute__((noinline)) void fma_peak(const float*, const float*, int64_t k, float* out) {
    int64_t n = k;
    asm volatile(
        "vxorps %%zmm30, %%zmm30, %%zmm30\n\t vxorps %%zmm31, %%zmm31, %%zmm31\n\t"
        "1:\n\t"
        RTP_FMAS(31, 0, 1, 2) RTP_FMAS(31, 3, 4, 5) RTP_FMAS(31, 6, 7, 8) RTP_FMAS(31, 9, 10, 11)
        RTP_FMAS(31, 12, 13, 14) RTP_FMAS(31, 15, 16, 17) RTP_FMAS(31, 18, 19, 20) RTP_FMAS(31, 21, 22, 23)
        "dec %[n]\n\t jnz 1b\n\t"
        "vmovups %%zmm0, (%[o])\n\t"
        : [n] "+r"(n)
        : [o] "r"(out)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm30", "xmm31");
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t k = argc > 1 ? std::atoll(argv[1]) : 896;
    float* pan = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(k * kCols * 4 + 63) / 64 * 64));
    std::vector<float> x(kRows * k), a(kRows * kCols), b(kRows * kCols);
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < k * kCols; ++i) pan[i] = u(gen);
    for (auto& v : x) v = u(gen);
    tile_intrinsics(pan, x.data(), k, a.data());
    tile_asm(pan, x.data(), k, b.data());
    std::printf("K %lld: the two tiles' sums %s\n", static_cast<long long>(k),
                std::memcmp(a.data(), b.data(), a.size() * 4) == 0 ? "equal" : "DIFFER");
    using Fn = void (*)(const float*, const float*, int64_t, float*);
    const Fn fns[] = {fma_peak, tile_intrinsics, tile_asm};
    const char* names[] = {"FMA peak (no loads)", "8x48 tile, intrinsics", "8x48 tile, assembly"};
    const int64_t calls = std::max<int64_t>(1, 20'000'000 / k);
    for (int round = 0; round < 3; ++round) {
        for (int f = 0; f < 3; ++f) {
            double best = 1e30;
            for (int t = 0; t < 5; ++t) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int64_t c = 0; c < calls; ++c) fns[f](pan, x.data(), k, a.data());
                best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            std::printf("round %d  %-24s %6.1f GFLOP/s\n", round, names[f], 2.0 * kRows * kCols * k * calls / best / 1e9);
        }
    }
    std::free(pan);
}
