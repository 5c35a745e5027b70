// Tiling plan of ApplyTopKTopPCustom: how rows are split over AI cores and how a vocabulary row is
// walked in UB-sized chunks. Plain, dependency-free C++: the op_host TilingFunc calls it with the
// platform's numbers, and a gtest on any machine calls it directly.
#ifndef APPLY_TOP_K_TOP_P_CUSTOM_TILING_PLAN_H
#define APPLY_TOP_K_TOP_P_CUSTOM_TILING_PLAN_H

#include <cstdint>

namespace apply_top_k_top_p {

// Tiling keys: the kernel has one TILING_KEY_IS branch per key (CANN compiles one binary per key).
enum TilingKey : uint32_t { kTopKTopP = 0, kTopKOnly = 1, kTopPOnly = 2, kCopy = 3 };

constexpr uint32_t kBlockBytes = 32;        // DataCopy granularity
constexpr uint32_t kMaxChunkElements = 1024;
constexpr uint32_t kBufferNum = 2;          // double buffering of copy-in / copy-out
constexpr uint64_t kReservedUbBytes = 8 * 1024;  // scatter staging slot, scalars, alignment slack

struct TilingParams {
    uint32_t batch = 0;
    uint32_t vocab = 0;
    uint32_t usedCores = 0;        // blockDim
    uint32_t batchPerCore = 0;     // rows every used core takes
    uint32_t tailBatch = 0;        // the first tailBatch cores take one row more
    uint32_t chunkElements = 0;    // ubFactorElement: vocabulary elements per chunk
    uint32_t tailChunkElements = 0;
    uint32_t iterateTimes = 0;     // chunks per row
    uint32_t tilingKey = kCopy;
};

// UB bytes one chunk element costs: double-buffered input (value + int32 index), the -inf fill row
// (budgeted at two values), and three float32 working buffers (exp, reduce result, reduce scratch).
inline uint64_t UbBytesPerElement(uint32_t dtypeBytes) {
    return kBufferNum * (dtypeBytes + 4u) + kBufferNum * dtypeBytes + 3u * 4u;
}

// Returns 0 on success, or a nonzero code whose meaning ErrorText() gives.
inline int ComputeTiling(uint32_t batch, uint32_t vocab, uint32_t dtypeBytes, uint32_t aivCores, uint64_t ubBytes,
                         bool hasK, bool hasP, TilingParams* out) {
    if (out == nullptr) return 1;
    if (batch == 0 || vocab == 0) return 2;
    if (dtypeBytes != 2 && dtypeBytes != 4) return 3;
    if (aivCores == 0) return 4;
    if (ubBytes <= kReservedUbBytes) return 5;
    const uint32_t align = kBlockBytes / dtypeBytes;  // elements per 32-byte block of values
    uint64_t fit = (ubBytes - kReservedUbBytes) / UbBytesPerElement(dtypeBytes);
    if (fit > kMaxChunkElements) fit = kMaxChunkElements;
    fit = fit / align * align;
    if (fit == 0) return 5;

    TilingParams t;
    t.batch = batch;
    t.vocab = vocab;
    t.usedCores = batch < aivCores ? batch : aivCores;
    t.batchPerCore = batch / t.usedCores;
    t.tailBatch = batch % t.usedCores;
    t.chunkElements = static_cast<uint32_t>(fit < vocab ? fit : ((vocab + align - 1) / align) * align);
    t.iterateTimes = (vocab + t.chunkElements - 1) / t.chunkElements;
    t.tailChunkElements = vocab - (t.iterateTimes - 1) * t.chunkElements;
    if (vocab == 1 || (!hasK && !hasP)) {
        t.tilingKey = kCopy;
    } else if (hasK && hasP) {
        t.tilingKey = kTopKTopP;
    } else {
        t.tilingKey = hasK ? kTopKOnly : kTopPOnly;
    }
    *out = t;
    return 0;
}

inline const char* ErrorText(int code) {
    switch (code) {
        case 0: return "ok";
        case 1: return "null output";
        case 2: return "batch and vocab must be >= 1";
        case 3: return "dtype must be 2 (float16/bfloat16) or 4 (float32) bytes";
        case 4: return "no AI vector core";
        case 5: return "UB too small for one 32-byte aligned chunk";
        default: return "unknown tiling error";
    }
}

// The rows core `core` handles: [first, first + count).
inline void RowsOfCore(const TilingParams& t, uint32_t core, uint32_t* first, uint32_t* count) {
    const uint32_t extra = core < t.tailBatch ? core : t.tailBatch;
    *first = core * t.batchPerCore + extra;
    *count = t.batchPerCore + (core < t.tailBatch ? 1u : 0u);
}

}  // namespace apply_top_k_top_p

#endif  // APPLY_TOP_K_TOP_P_CUSTOM_TILING_PLAN_H
