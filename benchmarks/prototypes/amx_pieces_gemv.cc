// A measured design that was not adopted (benchmarks/README.md, "AMX with exact bf16 pieces"): a GGUF 4-bit
// linear at one row on AMX tiles with exact products. x is split into three bf16 pieces (hi + mid + lo == x
// exactly), which are the A tile's rows; the 4-bit quants become bf16 B tiles through a vpermw table (q - 8, exact);
// each block's 32-k tile sum is stored and scaled by its d on the vector unit. Stand-alone, not part of the build:
//
//   g++ -O2 -march=sapphirerapids benchmarks/prototypes/amx_pieces_gemv.cc -o /tmp/amx_pieces
//   /tmp/amx_pieces 3072 576 1      # N K rows (rows <= 5: 3 rows of A per row of x)
//
// Prints the time of one call on one thread and the worst relative error against a float64 reference.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct TileConfig {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

uint16_t bf16_bits(float f) {  // round to nearest even (inputs here are finite)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 3072, k = argc > 2 ? std::atoi(argv[2]) : 576;
    const int m = argc > 3 ? std::atoi(argv[3]) : 1;
    if (n % 48 || k % 64 || m < 1 || m > 5) {
        std::fprintf(stderr, "N must be a multiple of 48, K of 64, rows 1..5\n");
        return 2;
    }
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        std::fprintf(stderr, "no AMX tile data permission on this CPU / kernel\n");
        return 2;
    }
    alignas(64) TileConfig cfg{};
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    cfg.rows[1] = cfg.rows[5] = cfg.rows[6] = cfg.rows[7] = static_cast<uint8_t>(3 * m);  // A: 1, C: 5-7; B: 2-4
    _tile_loadconfig(&cfg);

    const int blocks = k / 32, strips = n / 16;
    std::mt19937 gen(1);
    std::uniform_int_distribution<int> nib(0, 15);
    std::normal_distribution<float> normal;
    std::vector<uint8_t> q(static_cast<size_t>(n) * k);
    for (auto& v : q) v = static_cast<uint8_t>(nib(gen));
    std::vector<float> d(static_cast<size_t>(n) * blocks), x(static_cast<size_t>(m) * k);
    for (auto& v : d) v = std::ldexp(1.f + nib(gen) / 16.f, -8);
    for (auto& v : x) v = normal(gen);

    // Per 16-column strip and block: 8 x 32 bytes, byte j of chunk c holding (column j / 2) k = 4c + j % 2 in its
    // low nibble (B row 2c) and k + 2 in its high nibble (B row 2c + 1); d of the 16 columns.
    std::vector<uint8_t> packed(static_cast<size_t>(strips) * blocks * 256);
    std::vector<float> scales(static_cast<size_t>(strips) * blocks * 16);
    for (int s = 0; s < strips; ++s)
        for (int b = 0; b < blocks; ++b) {
            uint8_t* p = &packed[(static_cast<size_t>(s) * blocks + b) * 256];
            for (int c = 0; c < 8; ++c)
                for (int j = 0; j < 32; ++j) {
                    const int col = 16 * s + j / 2, k0 = 32 * b + 4 * c + j % 2;
                    p[32 * c + j] = static_cast<uint8_t>(q[static_cast<size_t>(col) * k + k0] |
                                                         (q[static_cast<size_t>(col) * k + k0 + 2] << 4));
                }
            for (int j = 0; j < 16; ++j) scales[(static_cast<size_t>(s) * blocks + b) * 16 + j] = d[(16 * s + j) * blocks + b];
        }
    alignas(64) uint16_t table[32];
    for (int i = 0; i < 32; ++i) table[i] = bf16_bits(static_cast<float>((i & 15) - 8));
    const __m512i lut = _mm512_load_si512(table);

    // A per block: rows 3r, 3r + 1, 3r + 2 = x row r's hi, mid, lo (hi, mid truncated; lo exact in bf16).
    std::vector<uint16_t> a(static_cast<size_t>(blocks) * 16 * 32, 0);
    for (int r = 0; r < m; ++r)
        for (int i = 0; i < k; ++i) {
            uint32_t u;
            std::memcpy(&u, &x[static_cast<size_t>(r) * k + i], 4);
            const float hi = bits_float(u & 0xffff0000u), r1 = x[static_cast<size_t>(r) * k + i] - hi;
            std::memcpy(&u, &r1, 4);
            const float mid = bits_float(u & 0xffff0000u), lo = r1 - mid;
            uint16_t* row = &a[(static_cast<size_t>(i / 32) * 16 + 3 * r) * 32];
            row[i % 32] = bf16_bits(hi);
            row[32 + i % 32] = bf16_bits(mid);
            row[64 + i % 32] = bf16_bits(lo);
        }

    std::vector<float> acc(static_cast<size_t>(m) * n);
    alignas(64) static uint16_t bbuf[2][3][16 * 32];
    alignas(64) static float cbuf[2][3][16 * 16];
    auto decode = [&](int s, int b, uint16_t* dst) {
        const uint8_t* p = &packed[(static_cast<size_t>(s) * blocks + b) * 256];
        for (int c = 0; c < 8; ++c) {
            const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c)));
            _mm512_store_si512(dst + 64 * c, _mm512_permutexvar_epi16(v, lut));
            _mm512_store_si512(dst + 64 * c + 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut));
        }
    };
    auto scale_into = [&](int s, int b, const float (*c)[16 * 16]) {
        for (int j = 0; j < 3; ++j) {
            const __m512 dj = _mm512_loadu_ps(&scales[(static_cast<size_t>(s + j) * blocks + b) * 16]);
            for (int r = 0; r < m; ++r) {
                float* out = &acc[static_cast<size_t>(r) * n + 16 * (s + j)];
                const float* t = c[j] + 48 * r;
                const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(t), _mm512_load_ps(t + 16)),
                                                 _mm512_load_ps(t + 32));
                _mm512_storeu_ps(out, _mm512_fmadd_ps(dj, sum, _mm512_loadu_ps(out)));
            }
        }
    };
    // Blocks outer (one A tile), three strips per step; the next step's B tiles decoded while this step's run.
    auto run = [&] {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int b = 0; b < blocks; ++b) {
            _tile_loadd(1, &a[static_cast<size_t>(b) * 16 * 32], 64);
            for (int j = 0; j < 3; ++j) decode(j, b, bbuf[0][j]);
            int step = 0;
            for (int s = 0; s < strips; s += 3, ++step) {
                const int cur = step & 1, nxt = cur ^ 1;
                _tile_loadd(2, bbuf[cur][0], 64);
                _tile_zero(5);
                _tile_dpbf16ps(5, 1, 2);
                _tile_loadd(3, bbuf[cur][1], 64);
                _tile_zero(6);
                _tile_dpbf16ps(6, 1, 3);
                _tile_loadd(4, bbuf[cur][2], 64);
                _tile_zero(7);
                _tile_dpbf16ps(7, 1, 4);
                if (s > 0) scale_into(s - 3, b, cbuf[nxt]);
                if (s + 3 < strips)
                    for (int j = 0; j < 3; ++j) decode(s + 3 + j, b, bbuf[nxt][j]);
                _tile_stored(5, cbuf[cur][0], 64);
                _tile_stored(6, cbuf[cur][1], 64);
                _tile_stored(7, cbuf[cur][2], 64);
            }
            scale_into(strips - 3, b, cbuf[(step - 1) & 1]);
        }
    };
    run();
    double worst = 0;
    for (int r = 0; r < m; ++r)
        for (int col = 0; col < n; col += 7) {
            double ref = 0, mag = 0;
            for (int i = 0; i < k; ++i) {
                const double t = static_cast<double>(d[col * blocks + i / 32]) * (q[static_cast<size_t>(col) * k + i] - 8) *
                                 x[static_cast<size_t>(r) * k + i];
                ref += t, mag += std::fabs(t);
            }
            worst = std::max(worst, std::fabs(ref - acc[static_cast<size_t>(r) * n + col]) / mag);
        }
    const int iters = static_cast<int>(4e9 / (static_cast<double>(n) * k * m) + 10);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("N %d K %d rows %d: %.1f us a call (one thread), worst error %.2g of the sum of |terms|\n", n, k, m,
                s * 1e6, worst);
    _tile_release();
    return 0;
}
