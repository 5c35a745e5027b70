// panel_linear.cc's bf16 GEMM on AMX tiles (amx_bf16, checked at run time: cpu_amx_bf16), on the same pair panels.
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/panel_tiles.h"
#include "rtp_llm/cpp/cpu/work_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)

namespace rtp_llm {
namespace panel {
namespace {

// AMX's bf16 tiles on the same pair panels. 16 pair steps of a panel's 16 columns are one B tile in the layout
// TDPBF16PS reads (row i: each column's (k 2i, k 2i + 1) pair), 16 pair steps of up to 16 x rows one A tile: a
// block of up to 16 rows by one panel keeps 3 C tiles (48 columns) and takes one A and three B tiles per 32 k.
// TDPBF16PS does not round after each product as vdpbf16ps does (it sums a tile step's products more exactly;
// measured here, not documented), so its sums are its own and every row count of a bf16 GEMM runs it: one
// k order in steps of 32 from zero tiles, then + bias, whatever rows share the call. K must be a multiple of 32.
#define RTP_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))

constexpr int64_t kAmxPairs = 16;  // pair steps per tile step (32 k)
constexpr int64_t kAmxRows = 16;   // rows per block

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Calls of up to 16 rows: tiles 0-2 C (rows x 16 fp32), 3 A (rows x 16 pairs), 4-6 B (16 pairs x 16 columns);
// more rows: 16-row tiles, 0-3 C, 4-5 A, 6-7 B.
RTP_AMX void amx_configure(int rows) {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = static_cast<uint8_t>(t < 4 ? rows : kAmxPairs);
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

RTP_AMX void amx_release() { _tile_release(); }

// The epilogue: C tiles stored to cbuf ([rows, 48] fp32), then tile()'s stores (+ bias, rounding, SiLU).
template <typename E, bool Gated>
RTP_AVX512_BF16 void amx_store(const float* cbuf, int rows, const float* bias, typename E::Out* out, int64_t ldo,
                               int cols, int exact_from) {
    for (int r = 0; r < rows; ++r) {
        __m512 acc[1][3];
        for (int c = 0; c < 3; ++c) acc[0][c] = _mm512_load_ps(cbuf + r * kPanelCols + 16 * c);
        if constexpr (Gated)
            gated_store<E, 1>(acc, bias, out + r * ldo, ldo, cols, exact_from);
        else
            plain_store<E, 1>(acc, bias, out + r * ldo, ldo, cols);
    }
}

// Up to 16 rows (the configured tile rows, row stride `pairs`) by the pair panel `pan`: per 32 k one A tile and
// the three B tiles of the panel's 48 columns. `lines` cache lines from `prefetch` requested meanwhile.
RTP_AMX void amx_rows16(const uint32_t* pan, const uint32_t* x, int64_t pairs, const char* prefetch, int64_t lines,
                        float* cbuf) {
    constexpr int64_t ldb = kPanelCols * 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    const int64_t steps = pairs / kAmxPairs, per_step = (lines + steps - 1) / steps;
    int64_t next = 0;
    for (int64_t s = 0; s < steps; ++s) {
        for (int64_t j = 0; j < per_step && next < lines; ++j, ++next) __builtin_prefetch(prefetch + 64 * next, 0, 2);
        const uint32_t* b = pan + s * kAmxPairs * kPanelCols;
        _tile_loadd(3, x + s * kAmxPairs, pairs * 4);
        _tile_loadd(4, b, ldb);
        _tile_loadd(5, b + 16, ldb);
        _tile_loadd(6, b + 32, ldb);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(2, 3, 6);
    }
    _tile_stored(0, cbuf, ldb);
    _tile_stored(1, cbuf + 16, ldb);
    _tile_stored(2, cbuf + 32, ldb);
}

// 32 rows (two 16-row tiles x0, x1; x1 null: x0's 16 alone) by the panel: its columns 0-31 as 2 x 2 C tiles
// (each A and B tile meets two others), then columns 32-47 as 2 x 1, so each B tile is read once per 32 rows
// and no tile is reloaded while an instruction still reads it.
RTP_AMX void amx_rows32(const uint32_t* pan, const uint32_t* x0, const uint32_t* x1, int64_t pairs,
                        const char* prefetch, int64_t lines, float* cbuf) {
    constexpr int64_t ldb = kPanelCols * 4, half = kAmxRows * kPanelCols;
    const int64_t steps = pairs / kAmxPairs, lda = pairs * 4, per_step = (lines + 2 * steps - 1) / (2 * steps);
    int64_t next = 0;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t s = 0; s < steps; ++s) {
        for (int64_t j = 0; j < per_step && next < lines; ++j, ++next) __builtin_prefetch(prefetch + 64 * next, 0, 2);
        const uint32_t* b = pan + s * kAmxPairs * kPanelCols;
        _tile_loadd(4, x0 + s * kAmxPairs, lda);
        _tile_loadd(6, b, ldb);
        _tile_loadd(7, b + 16, ldb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (x1) {
            _tile_loadd(5, x1 + s * kAmxPairs, lda);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, cbuf, ldb);
    _tile_stored(1, cbuf + 16, ldb);
    _tile_stored(2, cbuf + half, ldb);
    _tile_stored(3, cbuf + half + 16, ldb);
    _tile_zero(0);
    _tile_zero(2);
    for (int64_t s = 0; s < steps; ++s) {
        for (int64_t j = 0; j < per_step && next < lines; ++j, ++next) __builtin_prefetch(prefetch + 64 * next, 0, 2);
        _tile_loadd(4, x0 + s * kAmxPairs, lda);
        _tile_loadd(6, pan + s * kAmxPairs * kPanelCols + 32, ldb);
        _tile_dpbf16ps(0, 4, 6);
        if (x1) {
            _tile_loadd(5, x1 + s * kAmxPairs, lda);
            _tile_dpbf16ps(2, 5, 6);
        }
    }
    _tile_stored(0, cbuf + 32, ldb);
    _tile_stored(2, cbuf + half + 32, ldb);
}

// panel_linear_any on AMX (pairs % 16 == 0): row chunks, panels split across threads, each panel by the chunk's
// blocks of 32 rows (AmxRows).
template <typename E, bool Gated = false>
void amx_linear_any(const uint32_t* panels, const uint32_t* x, const float* bias, typename E::Out* out, int64_t m,
                    int64_t pairs, int64_t n) {
    constexpr int64_t oc = kOutCols<Gated>;
    const int64_t np = (n + oc - 1) / oc;
    const Following after = following_gemm();
    static_assert(kRowChunk % (2 * kAmxRows) == 0, "row chunks of whole blocks");
    for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
        const int64_t rows = std::min(kRowChunk, m - r0);
        const bool last = r0 + rows >= m;
        parallel_for(0, np, 1, [&](int64_t begin, int64_t end) {
            const AmxRows amx(x, m, pairs);
            alignas(64) float cbuf[2 * kAmxRows * kPanelCols];
            for (int64_t q = begin; q < end; ++q) {
                const NextPanel next = next_panel(panels, pairs, q, end, last, after);
                const int cols = static_cast<int>(std::min<int64_t>(oc, n - q * oc));
                const int exact_from = static_cast<int>(std::min<int64_t>(oc, (n & ~int64_t{7}) - q * oc));
                const int64_t blocks = (rows + 2 * kAmxRows - 1) / (2 * kAmxRows);
                const int64_t per_block = next.panel ? (next.lines + blocks - 1) / blocks : 0;
                int64_t line = 0;
                const uint32_t* pan = panels + q * pairs * kPanelCols;
                for (int64_t r = r0; r < r0 + rows; r += 2 * kAmxRows) {
                    const int64_t lines = std::max<int64_t>(0, std::min(per_block, next.lines - line));
                    const int64_t br = std::min(2 * kAmxRows, r0 + rows - r);
                    amx.sums(pan, r, br, lines ? next.panel + line * 64 : nullptr, lines, cbuf);
                    amx_store<E, Gated>(cbuf, static_cast<int>(br), bias ? bias + q * kPanelCols : nullptr,
                                        out + r * n + q * oc, n, cols, exact_from);
                    line += lines;
                }
            }
        });
    }
}

}  // namespace

AmxRows::AmxRows(const uint32_t* x_pairs, int64_t m, int64_t pairs)
    : x_(x_pairs), m_(m), pairs_(pairs), whole_(m > kAmxRows ? m / kAmxRows * kAmxRows : m) {
    if (whole_ < m_) {
        tail_.assign(kAmxRows * pairs, 0u);
        std::memcpy(tail_.data(), x_ + whole_ * pairs, static_cast<size_t>((m_ - whole_) * pairs) * 4);
    }
    amx_configure(static_cast<int>(std::min(m, kAmxRows)));
}

AmxRows::~AmxRows() { amx_release(); }

void AmxRows::sums(const uint32_t* pan, int64_t r, int64_t rows, const char* prefetch, int64_t lines,
                   float* cbuf) const {
    const auto rows_at = [&](int64_t i) { return i >= whole_ ? tail_.data() : x_ + i * pairs_; };
    if (m_ <= kAmxRows)
        amx_rows16(pan, x_, pairs_, prefetch, lines, cbuf);
    else
        amx_rows32(pan, rows_at(r), rows > kAmxRows ? rows_at(r + kAmxRows) : nullptr, pairs_, prefetch, lines, cbuf);
}

void AmxRows::store_panel(const uint32_t* pan, int64_t r0, int64_t rows, float* out, int64_t ldo, int cols,
                          const char* prefetch, int64_t lines) const {
    alignas(64) float cbuf[2 * kAmxRows * kPanelCols];
    const int64_t blocks = (rows + 2 * kAmxRows - 1) / (2 * kAmxRows), per_block = (lines + blocks - 1) / blocks;
    for (int64_t r = r0, b = 0; r < r0 + rows; r += 2 * kAmxRows, ++b) {
        const int64_t from = b * per_block, n = std::max<int64_t>(0, std::min(per_block, lines - from));
        const int64_t br = std::min(2 * kAmxRows, r0 + rows - r);
        sums(pan, r, br, n ? prefetch + from * 64 : nullptr, n, cbuf);
        amx_store<Bf16PairsFloatOut, false>(cbuf, static_cast<int>(br), nullptr, out + (r - r0) * ldo, ldo, cols, cols);
    }
}

bool amx_panels(int64_t pairs) { return pairs % kAmxPairs == 0 && cpu_amx_bf16(); }

void amx_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                     int64_t m, int64_t pairs, int64_t n) {
    amx_linear_any<Bf16Pairs>(panels, x_pairs, bias, out, m, pairs, n);
}

void amx_linear_silu_bf16(const uint32_t* panels, const uint32_t* x_pairs, const float* bias, c10::BFloat16* out,
                          int64_t m, int64_t pairs, int64_t inter) {
    amx_linear_any<Bf16Pairs, true>(panels, x_pairs, bias, out, m, pairs, inter);
}

void amx_linear_bf16(const uint32_t* panels, const uint32_t* x_pairs, float* out, int64_t m, int64_t pairs, int64_t n) {
    amx_linear_any<Bf16PairsFloatOut>(panels, x_pairs, nullptr, out, m, pairs, n);
}

}  // namespace panel
}  // namespace rtp_llm

#else

namespace rtp_llm {
namespace panel {
bool amx_panels(int64_t) { return false; }
void amx_linear_bf16(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t, int64_t) {}
void amx_linear_silu_bf16(const uint32_t*, const uint32_t*, const float*, c10::BFloat16*, int64_t, int64_t, int64_t) {}
void amx_linear_bf16(const uint32_t*, const uint32_t*, float*, int64_t, int64_t, int64_t) {}
AmxRows::AmxRows(const uint32_t* x_pairs, int64_t m, int64_t pairs) : x_(x_pairs), m_(m), pairs_(pairs), whole_(m) {}
AmxRows::~AmxRows() = default;
void AmxRows::sums(const uint32_t*, int64_t, int64_t, const char*, int64_t, float*) const {}
void AmxRows::store_panel(const uint32_t*, int64_t, int64_t, float*, int64_t, int, const char*, int64_t) const {}
}  // namespace panel
}  // namespace rtp_llm

#endif
