// LoRA deltas on a linear layer's output, every adapter group of a step in one call (the Punica shrink / expand
// per group): y[t] += (x[t] @ A^T) @ (B * scale)^T for each row t of a group, from the adapter's weights packed
// once, when the adapter is read (CpuOps.lora_pack), into tiles of 8 columns:
//   a  [ceil(R / 8), K, 8]: A^T's rank columns in tiles, each tile's K rows contiguous (the shrink streams it);
//   b  flat: per output tile, the rank rows that reach those 8 columns ([nj, 8], zero-padded past the last column);
//   tiles [Nt, 5] int64: per output tile (offset of its data in b, first rank row j0, nj, y column, width <= 8).
// A fused layer's modules (q, k, v; gate, up) own disjoint rank rows and columns, so a tile holds only its module's
// rank rows: the zeros of the joined matrix are neither stored nor read. The y column of a tile is free, so the same
// packing serves gate_up's output in gated panels' order (fused_layers.py remaps the tiles' columns).
//
// Why a kernel: a step with several adapters made ~4 ATen calls and two GEMM calls per (layer, linear, group), each
// tiny (8 rows, rank 16); here the shrink and the expand of every group's rows are one rtp_llm::parallel_for over
// blocks of up to 8 rows of a group (the adapter's weights read once per block, 8 rows' sums in registers; a decode
// step's few blocks split by tiles across threads). Each output element is one thread's, computed in an order fixed
// by the element (float32 fused multiply-adds, k ascending, then the rank ascending, added to y once), so a row's
// bits do not depend on its group, the step or the thread: the Python layers and decoder_layers call this kernel.
// On AVX-512 CPUs two tiles go in one 16-lane register (rows_block_avx512), lane for lane the same bits.
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "rtp_llm/cpp/cpu/ops.h"
#include "rtp_llm/cpp/cpu/cpu_features.h"
#include "rtp_llm/cpp/cpu/vec/avx2.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "rtp_llm/cpp/cpu/vec/avx512.h"
#endif
#include "rtp_llm/cpp/cpu/work_pool.h"

namespace rtp_llm {
namespace {

constexpr int64_t kRows = 8;           // rows of a group computed together (the adapter's weights read once)
constexpr int64_t kPartTiles = 128;    // a split decode step's parts hold at least this many tiles (1024 columns)
constexpr int64_t kMinBytes = 1 << 16;  // adapter weight bytes below which a call runs on the calling thread

struct Group {
    const int64_t* rows;  // nullptr: rows 0..n-1
    int64_t n, r;
    const float* a;        // [ceil(r / 8), K, 8]
    const float* b;        // tiles' data
    const int64_t* tiles;  // [nt, 5]
    int64_t nt;
};

// Q rows of one group over tiles [t0, t1): the shrink into mid [Q, ceil(r / 8) * 8], then each tile's expand with
// Q accumulators in registers.
// The block's rows as float32, xf [Q, k]: what the shrink broadcasts.
template <int Q, typename T>
void rows_to_float(const T* const* xr, int64_t k, float* xf) {
    for (int q = 0; q < Q; ++q)
        for (int64_t c = 0; c < k; ++c) xf[q * k + c] = static_cast<float>(xr[q][c]);
}

// The shrink for rank tile jt: mid[:, 8jt..8jt+7] = x @ a's tile, k ascending.
template <int Q>
void shrink_tile(const Group& g, int64_t jt, int64_t k, const float* xf, float* mid) {
    const int64_t rt = (g.r + 7) / 8;
    const float* at = g.a + jt * k * 8;
    __m256 acc[Q];
    for (int q = 0; q < Q; ++q) acc[q] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; ++c) {
        const __m256 w = _mm256_loadu_ps(at + c * 8);
        for (int q = 0; q < Q; ++q) acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(xf[q * k + c]), w, acc[q]);
    }
    for (int q = 0; q < Q; ++q) _mm256_storeu_ps(mid + q * rt * 8 + jt * 8, acc[q]);
}

template <int Q, typename T>
void rows_block(const Group& g, const T* const* xr, T* const* yr, int64_t k, int64_t t0, int64_t t1, float* xf,
                float* mid) {
    rows_to_float<Q>(xr, k, xf);
    const int64_t rt = (g.r + 7) / 8;
    for (int64_t jt = 0; jt < rt; ++jt) shrink_tile<Q>(g, jt, k, xf, mid);
    alignas(32) float tmp[8];
    alignas(32) T out[8];
    for (int64_t t = t0; t < t1; ++t) {  // expand: y[:, tile] += mid @ the tile's rank rows, the rank ascending
        const int64_t* d = g.tiles + t * 5;
        const float* bt = g.b + d[0];
        const int64_t j0 = d[1], nj = d[2], col = d[3], width = d[4];
        __m256 acc[Q];
        for (int q = 0; q < Q; ++q) acc[q] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nj; ++j) {
            const __m256 w = _mm256_loadu_ps(bt + j * 8);
            for (int q = 0; q < Q; ++q)
                acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(mid[q * rt * 8 + j0 + j]), w, acc[q]);
        }
        for (int q = 0; q < Q; ++q) {
            T* yq = yr[q] + col;
            if (width == 8) {
                vec::store8(yq, _mm256_add_ps(vec::load8(yq), acc[q]));
            } else {  // a module's last tile: only its columns
                _mm256_store_ps(tmp, acc[q]);
                for (int64_t c = 0; c < width; ++c) out[c] = vec::to<T>(static_cast<float>(yq[c]) + tmp[c]);
                std::copy(out, out + width, yq);
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same block on AVX-512 (cpu_avx512()): two rank tiles of the shrink, and two output tiles of the expand that
// share their rank rows and sit side by side in y, in one 16-lane register. Lanes are independent, so every
// element gets the fused multiply-adds of rows_block in the same order: the same bits.
template <int Q, typename T>
RTP_AVX512 void rows_block_avx512(const Group& g, const T* const* xr, T* const* yr, int64_t k, int64_t t0,
                                  int64_t t1, float* xf, float* mid) {
    rows_to_float<Q>(xr, k, xf);
    const int64_t rt = (g.r + 7) / 8;
    int64_t jt = 0;
    for (; jt + 1 < rt; jt += 2) {
        const float* lo = g.a + jt * k * 8;
        const float* hi = lo + k * 8;
        __m512 acc[Q];
        for (int q = 0; q < Q; ++q) acc[q] = _mm512_setzero_ps();
        for (int64_t c = 0; c < k; ++c) {
            const __m512 w = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(lo + c * 8)),
                                                _mm256_loadu_ps(hi + c * 8), 1);
            for (int q = 0; q < Q; ++q) acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(xf[q * k + c]), w, acc[q]);
        }
        for (int q = 0; q < Q; ++q) _mm512_storeu_ps(mid + q * rt * 8 + jt * 8, acc[q]);
    }
    if (jt < rt) shrink_tile<Q>(g, jt, k, xf, mid);  // an odd last rank tile
    alignas(64) float tmp[16];
    alignas(32) T out[8];
    for (int64_t t = t0; t < t1;) {
        const int64_t* d = g.tiles + t * 5;
        const int64_t* e = d + 5;
        const bool pair = t + 1 < t1 && d[4] == 8 && e[1] == d[1] && e[2] == d[2] && e[3] == d[3] + 8;
        const float* b0 = g.b + d[0];
        const float* b1 = pair ? g.b + e[0] : b0;
        const int64_t j0 = d[1], nj = d[2], col = d[3], width = pair ? 8 + e[4] : d[4];
        __m512 acc[Q];
        for (int q = 0; q < Q; ++q) acc[q] = _mm512_setzero_ps();
        for (int64_t j = 0; j < nj; ++j) {
            const __m512 w = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(b0 + j * 8)),
                                                _mm256_loadu_ps(b1 + j * 8), 1);
            for (int q = 0; q < Q; ++q)
                acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(mid[q * rt * 8 + j0 + j]), w, acc[q]);
        }
        for (int q = 0; q < Q; ++q) {
            T* yq = yr[q] + col;
            _mm512_store_ps(tmp, acc[q]);
            for (int64_t h = 0; h < width; h += 8) {
                if (width - h >= 8) {
                    vec::store8(yq + h, _mm256_add_ps(vec::load8(yq + h), _mm256_load_ps(tmp + h)));
                } else {
                    for (int64_t c = h; c < width; ++c) out[c - h] = vec::to<T>(static_cast<float>(yq[c]) + tmp[c]);
                    std::copy(out, out + (width - h), yq + h);
                }
            }
        }
        t += pair ? 2 : 1;
    }
}
#endif

// f(std::integral_constant<int, Q>) for a block of `count` rows (1..8): the kernels take Q at compile time.
template <typename F>
void with_rows(int64_t count, F&& f) {
    switch (count) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

template <typename T>
void run(const at::Tensor& x, at::Tensor& y, const std::vector<Group>& groups, int64_t max_r) {
    const int64_t k = x.size(1), n_out = y.size(1);
    const T* xp = x.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    struct Block {
        int32_t group;
        int64_t first, count;  // rows first.. of the group
    };
    std::vector<Block> blocks;
    int64_t max_tiles = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
        max_tiles = std::max(max_tiles, groups[gi].nt);
        for (int64_t i = 0; i < groups[gi].n; i += kRows)
            blocks.push_back({static_cast<int32_t>(gi), i, std::min(kRows, groups[gi].n - i)});
    }
    // Few blocks (a decode step's few rows): their tiles split too, each part computing the block's shrink again,
    // so that both threads stream the adapter's weights.
    const int64_t parts = static_cast<int64_t>(blocks.size()) >= 4 ? 1
                          : std::max<int64_t>(1, std::min<int64_t>(4, max_tiles / kPartTiles));
    // the weights an item reads: what makes a call worth more than one thread (the work is memory-bound)
    const int64_t item_bytes = std::max<int64_t>(1, max_r * (k + 8 * max_tiles / parts) * 4);
    const int64_t rt_max = (max_r + 7) / 8;
    const bool avx512 = cpu_avx512();
    parallel_for(0, static_cast<int64_t>(blocks.size()) * parts, (kMinBytes + item_bytes - 1) / item_bytes,
                 [&](int64_t b, int64_t e) {
        std::vector<float> xf(kRows * k), mid(kRows * rt_max * 8);
        for (int64_t it = b; it < e; ++it) {
            const Block& blk = blocks[it / parts];
            const Group& g = groups[blk.group];
            const int64_t per = (g.nt + parts - 1) / parts, t0 = std::min(g.nt, (it % parts) * per);
            const int64_t t1 = std::min(g.nt, t0 + per);
            const T* xr[kRows];
            T* yr[kRows];
            for (int64_t q = 0; q < blk.count; ++q) {
                const int64_t i = blk.first + q, row = g.rows ? g.rows[i] : i;
                xr[q] = xp + row * k;
                yr[q] = yp + row * n_out;
            }
            float* xb = xf.data();
            float* m = mid.data();
            with_rows(blk.count, [&](auto rows) {
                constexpr int Q = decltype(rows)::value;
#if defined(__x86_64__) && defined(__GNUC__)
                if (avx512) return rows_block_avx512<Q>(g, xr, yr, k, t0, t1, xb, m);
#endif
                rows_block<Q>(g, xr, yr, k, t0, t1, xb, m);
            });
        }
    });
}

}  // namespace

void lora_add_(at::Tensor& y, const at::Tensor& x, const c10::List<std::optional<at::Tensor>>& rows,
               const c10::List<at::Tensor>& a, const c10::List<at::Tensor>& b, const c10::List<at::Tensor>& tiles) {
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0) && x.is_contiguous() && y.is_contiguous(),
                "lora_add_: x [T, K] and y [T, N], contiguous");
    TORCH_CHECK(x.scalar_type() == y.scalar_type() &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                     x.scalar_type() == at::kHalf),
                "lora_add_: x and y of one dtype: float32, bfloat16 or float16");
    TORCH_CHECK(rows.size() == a.size() && a.size() == b.size() && b.size() == tiles.size(),
                "lora_add_: rows, a, b and tiles per group");
    const int64_t tokens = x.size(0), k = x.size(1), n_out = y.size(1);
    std::vector<Group> groups;
    std::vector<at::Tensor> keep;
    std::vector<char> taken(tokens, 0);  // each row in one group at most: its output has one writer
    int64_t total = 0, max_r = 0;
    for (size_t gi = 0; gi < a.size(); ++gi) {
        const at::Tensor ag = a.get(gi), bg = b.get(gi), tg = tiles.get(gi);
        TORCH_CHECK(ag.scalar_type() == at::kFloat && bg.scalar_type() == at::kFloat && ag.is_contiguous() &&
                        bg.is_contiguous() && ag.dim() == 3 && ag.size(1) == k && ag.size(2) == 8 &&
                        bg.dim() == 1 && tg.scalar_type() == at::kLong && tg.is_contiguous() && tg.dim() == 2 &&
                        tg.size(1) == 5,
                    "lora_add_: packed weights a [R/8, K, 8] and b float32, tiles [Nt, 5] int64 (CpuOps.lora_pack)");
        const int64_t r = ag.size(0) * 8;
        const int64_t* td = tg.data_ptr<int64_t>();
        for (int64_t t = 0; t < tg.size(0); ++t) {  // every tile inside y, b and the rank: no read or write outside
            const int64_t* d = td + t * 5;
            TORCH_CHECK(d[0] >= 0 && d[2] >= 0 && d[0] + d[2] * 8 <= bg.numel() && d[1] >= 0 && d[1] + d[2] <= r &&
                            d[4] >= 1 && d[4] <= 8 && d[3] >= 0 && d[3] + d[4] <= n_out,
                        "lora_add_: tile ", t, " reaches outside b, the rank or y's ", n_out, " columns");
        }
        Group g{nullptr, tokens, r, ag.data_ptr<float>(), bg.data_ptr<float>(), td, tg.size(0)};
        const std::optional<at::Tensor> rg = rows.get(gi);
        if (rg.has_value() && rg->defined()) {
            const at::Tensor rr = rg->to(at::kLong).contiguous();
            TORCH_CHECK(rr.dim() == 1, "lora_add_: rows must be [n]");
            const int64_t* rp = rr.data_ptr<int64_t>();
            for (int64_t i = 0; i < rr.numel(); ++i) {
                TORCH_CHECK(rp[i] >= 0 && rp[i] < tokens, "lora_add_: row ", rp[i], " outside [0, ", tokens, ")");
                TORCH_CHECK(!taken[rp[i]]++, "lora_add_: row ", rp[i], " in two groups");
            }
            g.rows = rp;
            g.n = rr.numel();
            keep.push_back(rr);
        } else {
            for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(!taken[t]++, "lora_add_: row ", t, " in two groups");
        }
        total += g.n;
        max_r = std::max(max_r, g.r);
        groups.push_back(g);
    }
    if (total == 0) return;
    if (x.scalar_type() == at::kFloat) {
        run<float>(x, y, groups, max_r);
    } else if (x.scalar_type() == at::kBFloat16) {
        run<c10::BFloat16>(x, y, groups, max_r);
    } else {
        run<c10::Half>(x, y, groups, max_r);
    }
}

}  // namespace rtp_llm
