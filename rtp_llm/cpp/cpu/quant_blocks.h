// GGUF's block formats, as stored in the file (ggml's block_q8_0, block_q4_0, ..., block_q6_K), and each weight's
// value exactly as gguf's dequantize computes it in float32:
//   32-element blocks: Q8_0 d*q; Q4_0 d*(q-8); Q4_1 d*q + m (the product rounded, then the sum); Q5_0 d*(q-16);
//   Q5_1 d*q + m (q's fifth bit from the 32-bit qh);
//   256-element k-quants, 8 sub-blocks of 32: Q4_K / Q5_K (d*sc)*q - (dmin*m) with 6-bit sc, m per sub-block;
//   Q6_K (d*sc)*(q-32) with an int8 sc per 16 elements.
// A format is told by its block's byte size (34, 18, 20, 22, 24; 144, 176, 210), so a weight is a uint8 tensor
// [N, blocks, block bytes]. Kernels walk a block 32 elements (one sub-block) at a time.
// Compiled with -ffp-contract=off: a fused d*q + m would round once and differ from the file's math.
#pragma once

#include <c10/util/Half.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace rtp_llm {
namespace quant {

constexpr int kBlock = 32;  // elements of a 32-element block, and of a k-quant's sub-block

enum class Format { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kUnknown };

constexpr bool is_k_quant(Format f) { return f == Format::kQ4_K || f == Format::kQ5_K || f == Format::kQ6_K; }
constexpr int elements(Format f) { return is_k_quant(f) ? 256 : 32; }

inline Format format_of(int64_t block_bytes) {
    switch (block_bytes) {
        case 34: return Format::kQ8_0;
        case 18: return Format::kQ4_0;
        case 20: return Format::kQ4_1;
        case 22: return Format::kQ5_0;
        case 24: return Format::kQ5_1;
        case 144: return Format::kQ4_K;
        case 176: return Format::kQ5_K;
        case 210: return Format::kQ6_K;
        default: return Format::kUnknown;
    }
}

// The fp16 scale at p as float32 (exact): one F16C instruction where the build has it.
inline float half_at(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(bits);
#else
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// Whether a stored block's fp16 scales (d, and the min or dmin where the format has one) are finite. No quantizer
// writes inf or NaN there; a file that has them is corrupt (llama.cpp's row validation refuses it too), and the
// kernels' fused decode (d q - 8 d) would turn a gguf inf into NaN.
inline bool finite_scales(Format f, const uint8_t* b) {
    auto finite = [&](int at) {
        uint16_t bits;
        std::memcpy(&bits, b + at, 2);
        return (bits & 0x7C00) != 0x7C00;
    };
    switch (f) {
        case Format::kQ6_K: return finite(208);
        case Format::kQ4_1:
        case Format::kQ5_1:
        case Format::kQ4_K:
        case Format::kQ5_K: return finite(0) && finite(2);
        default: return finite(0);
    }
}

// Q4_K / Q5_K: sub-block s's 6-bit scale and min from the 12 packed bytes.
inline void k_scale_min(const uint8_t* sc12, int s, int* sc, int* m) {
    if (s < 4) {
        *sc = sc12[s] & 0x3F;
        *m = sc12[s + 4] & 0x3F;
    } else {
        *sc = (sc12[s + 4] & 0x0F) | ((sc12[s - 4] >> 2) & 0x30);
        *m = (sc12[s + 4] >> 4) | ((sc12[s] >> 2) & 0x30);
    }
}

// Q6_K's 6-bit quant of element i (0..31) of group g (0..7), before the -32.
inline int q6_k(const uint8_t* b, int g, int i) {
    const int h = g / 4, k = g % 4;
    const int low = (b[64 * h + 32 * (k % 2) + i] >> (4 * (k / 2))) & 0x0F;
    const int high = (b[128 + 32 * h + i] >> (2 * k)) & 0x03;
    return low | (high << 4);
}

// The 32 values of sub-block s of a k-quant block.
inline void decode_k_sub(Format f, const uint8_t* __restrict b, int s, float* __restrict w) {
    if (f == Format::kQ6_K) {
        const float d = half_at(b + 208);
        const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
        const float d0 = d * static_cast<float>(scales[2 * s]), d1 = d * static_cast<float>(scales[2 * s + 1]);
        for (int i = 0; i < 32; ++i) w[i] = (i < 16 ? d0 : d1) * static_cast<float>(q6_k(b, s, i) - 32);
        return;
    }
    int sc, m;
    k_scale_min(b + 4, s, &sc, &m);
    const float ds = half_at(b) * static_cast<float>(sc), dm = half_at(b + 2) * static_cast<float>(m);
    const uint8_t* qs = b + (f == Format::kQ5_K ? 48 : 16) + 32 * (s / 2);
    for (int i = 0; i < 32; ++i) {
        int q = (qs[i] >> (4 * (s % 2))) & 0x0F;
        if (f == Format::kQ5_K) q |= ((b[16 + i] >> s) & 1) << 4;
        w[i] = ds * static_cast<float>(q) - dm;
    }
}

// The elements(f) values of one block, in order (in the 32-element formats element j and j + 16 share byte j).
inline void decode_block(Format f, const uint8_t* __restrict b, float* __restrict w) {
    if (is_k_quant(f)) {
        for (int s = 0; s < 8; ++s) decode_k_sub(f, b, s, w + 32 * s);
        return;
    }
    const float d = half_at(b);
    switch (f) {
        case Format::kQ8_0:
            for (int j = 0; j < kBlock; ++j) w[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
            return;
        case Format::kQ4_0:
            for (int j = 0; j < 16; ++j) {
                w[j] = static_cast<float>((b[2 + j] & 0x0F) - 8) * d;
                w[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
            }
            return;
        case Format::kQ4_1: {
            const float m = half_at(b + 2);
            for (int j = 0; j < 16; ++j) {
                w[j] = d * static_cast<float>(b[4 + j] & 0x0F) + m;
                w[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
            }
            return;
        }
        case Format::kQ5_0:
        case Format::kQ5_1: {
            const bool q51 = f == Format::kQ5_1;
            const float m = q51 ? half_at(b + 2) : 0.f;
            const uint8_t* qhp = b + (q51 ? 4 : 2);
            const uint8_t* qs = qhp + 4;
            uint32_t qh;
            std::memcpy(&qh, qhp, 4);
            for (int j = 0; j < 16; ++j) {
                const int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
                const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                if (q51) {
                    w[j] = d * static_cast<float>(lo) + m;
                    w[j + 16] = d * static_cast<float>(hi) + m;
                } else {
                    w[j] = d * static_cast<float>(lo - 16);
                    w[j + 16] = d * static_cast<float>(hi - 16);
                }
            }
            return;
        }
        default: return;
    }
}

}  // namespace quant
}  // namespace rtp_llm
