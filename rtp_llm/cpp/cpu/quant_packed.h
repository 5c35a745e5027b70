// GGUF blocks repacked at load for the CPU kernels (quant_pack): 16 output rows interleaved per block, so that a
// block decodes into k-major vectors of 16 rows' weights, the layout of the fp32 panels (panel_linear.cc), and
// the quantized GEMM runs the fp32 panel tiles on the decoded panel: the same FMA chain per output over k as the
// dequantized model, so the two give the same bits at every row count. Same bytes as stored, except the
// k-quants' packed 6-bit scales, kept as bytes (Q4_K 148 and Q5_K 180 bytes per row-block instead of 144, 176).
//
// Packed weight: uint8 [ceil(N / 16), K / elements(f), 16 * row bytes]; rows past N are zero (weights 0).
// A group-block (16 rows x the block's elements; "[a][16]" = 16 values, one per row, for each a):
//   Q8_0  d[16] fp16 | words[8][16] uint32       word [w][r]: row r's elements 4w..4w+3, q + 128 a byte each
//   Q4_0  words[4][16] uint32 | d[16]           word [w][r]: row r's elements 8w..8w+7, a nibble each (slots below)
//   Q4_1  d[16] | m[16] | words[4][16]           (a tensor with a block whose slots are inexact: packed as Q5_1)
//   Q5_0  d[16] | fifth[32] uint16 | words[4][16]  fifth[e] bit r: row r's element e's bit 4; nibbles as Q4_0's
//   Q5_1  d[16] | m[16] | fifth[32] | nib[16][16]
//   Q4_K  d[16] | dmin[16] | sc[8][16] | mn[8][16] (the 6-bit sub-block scales and mins) | nib[128][16]
//   Q5_K  Q4_K's, then fifth[256] uint16 after mn
//   Q6_K  d[16] | sc[16][16] int8 | nib[128][16] | hi[64][16]  hi byte [i][r] bits 2j, 2j+1: element 4i + j's bits 4-5
//   Q5_1 / k-quants: nib byte [i][r]: row r's element 2i (low nibble), 2i+1 (high)
// Values as quant_blocks.h computes them (gguf's float32 arithmetic).
//
// Slots (Q4_0, Q4_1, Q5_0's low 4 bits): element 8w + i's nibble sits at bits kSlotBit[i].. (mod 32) of its word,
// so that the word itself, rotated left by 12 and by 24, holds three elements' nibbles at bits 19, 15 and 11 (two
// at 19, 15 in the last). A nibble q at bit p, masked and or'ed into the exponent of 2^(19-p), is the float
// 2^(19-p) + q / 16 (Q5_0's fifth bit adds 1, exactly); the weight d q + m is then one FMA of it with 16 d and
// c = m - d 2^(23-p) (Q4_0: -(8 + 2^(23-p)) d; Q5_0: -(16 + 2^(23-p)) d), rounded once to gguf's value when c is
// exact: always for Q4_0 and Q5_0 (at most 21 significant bits), checked per block at pack time for Q4_1
// (slots_exact). The AVX-512 decode is then a mask-or, an FMA and an eighth of a rotation per weight instead of an
// extraction, a conversion and an FMA.
// Q8_0 the same way with bytes: element 4w + i's q + 128 at bits kByteSlotBit[i].. of its word, two at bits 15 and
// 7 of the word and two of it rotated by 16; 256 d f + c = d q exactly (c = -384 d or -65664 d: exact).
#pragma once

#include "rtp_llm/cpp/cpu/quant_blocks.h"

namespace rtp_llm {
namespace quant {

constexpr int kLanes = 16;  // output rows per group

// Byte offsets inside a group-block (-1: the format has no such part) and its size.
struct PackedLayout {
    int d, m, sc, mn, fifth, q, hi, bytes;
};

constexpr PackedLayout packed_layout(Format f) {
    switch (f) {
        case Format::kQ8_0: return {0, -1, -1, -1, -1, 32, -1, 544};
        case Format::kQ4_0: return {256, -1, -1, -1, -1, 0, -1, 288};
        case Format::kQ4_1: return {0, 32, -1, -1, -1, 64, -1, 320};
        case Format::kQ5_0: return {0, -1, -1, -1, 32, 96, -1, 352};
        case Format::kQ5_1: return {0, 32, -1, -1, 64, 128, -1, 384};
        case Format::kQ4_K: return {0, 32, 64, 192, -1, 320, -1, 2368};
        case Format::kQ5_K: return {0, 32, 64, 192, 320, 832, -1, 2880};
        case Format::kQ6_K: return {0, -1, 32, -1, -1, 288, 2336, 3360};
        default: return {-1, -1, -1, -1, -1, -1, -1, 0};
    }
}

// Whether the format's quants are packed in slot words (above), and element i's (of 8 nibbles, 4 bytes) bit in its
// word.
constexpr bool slot_words(Format f) {
    return f == Format::kQ4_0 || f == Format::kQ4_1 || f == Format::kQ5_0 || f == Format::kQ8_0;
}
constexpr int kSlotBit[8] = {19, 15, 11, 7, 3, 31, 27, 23};
constexpr int kByteSlotBit[4] = {15, 7, 31, 23};
constexpr int kSlotShift[3] = {4, 8, 12};  // d's exponent steps for the slots at bits 19, 15, 11 (23 - bit)

inline uint32_t rotl32(uint32_t v, int by) { return by == 0 ? v : (v << by) | (v >> (32 - by)); }

// The quant of element e (0..31) in row r's slot words, as stored (Q8_0: q + 128).
inline int slot_quant(Format f, const uint8_t* words, int r, int e) {
    const bool bytes = f == Format::kQ8_0;
    const int per = bytes ? 4 : 8, bit = bytes ? kByteSlotBit[e % 4] : kSlotBit[e % 8];
    uint32_t v;
    std::memcpy(&v, words + 64 * (e / per) + 4 * r, 4);
    return static_cast<int>(rotl32(v, (32 - bit) % 32) & (bytes ? 0xFF : 0x0F));
}

// Sets element e's quant (Q8_0: q + 128) in row r's slot words.
inline void set_slot_quant(Format f, uint8_t* words, int r, int e, int q) {
    const bool bytes = f == Format::kQ8_0;
    const int per = bytes ? 4 : 8, bit = bytes ? kByteSlotBit[e % 4] : kSlotBit[e % 8];
    uint8_t* word = words + 64 * (e / per) + 4 * r;
    uint32_t v;
    std::memcpy(&v, word, 4);
    v |= rotl32(static_cast<uint32_t>(q & (bytes ? 0xFF : 0x0F)), bit);
    std::memcpy(word, &v, 4);
}

// Q4_1: whether a stored block's c = m - d 2^s is exact in float32 for every slot (then the slot decode gives
// gguf's value for every q). Real files: every block of SmolLM2's; a block whose min is tiny beside d 2^12 is not.
inline bool slots_exact(const uint8_t* b) {
    const float d = half_at(b), m = half_at(b + 2);
    for (int s : kSlotShift) {
        const float dp = d * static_cast<float>(1 << s);  // exact: a power of two, no overflow from fp16
        const float c = m - dp;
        if (static_cast<double>(c) != static_cast<double>(m) - static_cast<double>(dp)) return false;
    }
    return true;
}

inline Format packed_format_of(int64_t group_bytes) {
    for (Format f : {Format::kQ8_0, Format::kQ4_0, Format::kQ4_1, Format::kQ5_0, Format::kQ5_1, Format::kQ4_K,
                     Format::kQ5_K, Format::kQ6_K})
        if (packed_layout(f).bytes == group_bytes) return f;
    return Format::kUnknown;
}

// Element e's integer quant in a stored block, as the format stores it (no offset applied).
inline int stored_q(Format f, const uint8_t* b, int e) {
    switch (f) {
        case Format::kQ8_0: return static_cast<int8_t>(b[2 + e]);
        case Format::kQ4_0: return (b[2 + e % 16] >> (4 * (e / 16))) & 0x0F;
        case Format::kQ4_1: return (b[4 + e % 16] >> (4 * (e / 16))) & 0x0F;
        case Format::kQ5_0:
        case Format::kQ5_1: {
            const int off = f == Format::kQ5_1 ? 4 : 2;
            uint32_t qh;
            std::memcpy(&qh, b + off, 4);
            return ((b[off + 4 + e % 16] >> (4 * (e / 16))) & 0x0F) | (((qh >> e) & 1) << 4);
        }
        case Format::kQ4_K:
        case Format::kQ5_K: {
            const int s = e / 32, i = e % 32;
            const uint8_t* qs = b + (f == Format::kQ5_K ? 48 : 16) + 32 * (s / 2);
            int q = (qs[i] >> (4 * (s % 2))) & 0x0F;
            if (f == Format::kQ5_K) q |= ((b[16 + i] >> s) & 1) << 4;
            return q;
        }
        case Format::kQ6_K: return q6_k(b, e / 32, e % 32);
        default: return 0;
    }
}

// Row r's element e of a group-block as gguf's dequantize gives it (the scalar form of the kernels' decode).
inline float packed_value(Format f, const uint8_t* g, int r, int e) {
    const PackedLayout L = packed_layout(f);
    const float d = half_at(g + L.d + 2 * r);
    int q;
    if (f == Format::kQ8_0) {
        q = slot_quant(f, g + L.q, r, e) - 128;
    } else {
        q = slot_words(f) ? slot_quant(f, g + L.q, r, e) : (g[L.q + kLanes * (e / 2) + r] >> (4 * (e % 2))) & 0x0F;
        if (L.fifth >= 0) {
            uint16_t bits;
            std::memcpy(&bits, g + L.fifth + 2 * e, 2);
            q |= ((bits >> r) & 1) << 4;
        }
        if (L.hi >= 0) q |= ((g[L.hi + kLanes * (e / 4) + r] >> (2 * (e % 4))) & 0x03) << 4;
    }
    switch (f) {
        case Format::kQ8_0: return static_cast<float>(q) * d;
        case Format::kQ4_0: return static_cast<float>(q - 8) * d;
        case Format::kQ5_0: return d * static_cast<float>(q - 16);
        case Format::kQ4_1:
        case Format::kQ5_1: return d * static_cast<float>(q) + half_at(g + L.m + 2 * r);
        case Format::kQ4_K:
        case Format::kQ5_K: {
            const int s = e / 32;
            const float ds = d * static_cast<float>(g[L.sc + kLanes * s + r]);
            const float dm = half_at(g + L.m + 2 * r) * static_cast<float>(g[L.mn + kLanes * s + r]);
            return ds * static_cast<float>(q) - dm;
        }
        case Format::kQ6_K: {
            const float ds = d * static_cast<float>(static_cast<int8_t>(g[L.sc + kLanes * (e / 16) + r]));
            return ds * static_cast<float>(q - 32);
        }
        default: return 0.f;
    }
}

// Writes row r (0-15) of a group-block in format f from stored block b of format `stored` (f itself, or Q4_1
// blocks packed as Q5_1: the same d and m, fifth bits zero).
inline void pack_row(Format f, Format stored, const uint8_t* b, int r, uint8_t* g) {
    const PackedLayout L = packed_layout(f);
    const int n = elements(f);
    if (f == Format::kQ6_K) {
        std::memcpy(g + L.d + 2 * r, b + 208, 2);
        for (int t = 0; t < 16; ++t) g[L.sc + kLanes * t + r] = b[192 + t];
    } else {
        std::memcpy(g + L.d + 2 * r, b, 2);
        if (L.m >= 0) std::memcpy(g + L.m + 2 * r, b + 2, 2);
    }
    if (L.sc >= 0 && f != Format::kQ6_K) {
        for (int s = 0; s < 8; ++s) {
            int sc, m;
            k_scale_min(b + 4, s, &sc, &m);
            g[L.sc + kLanes * s + r] = static_cast<uint8_t>(sc);
            g[L.mn + kLanes * s + r] = static_cast<uint8_t>(m);
        }
    }
    for (int e = 0; e < n; ++e) {
        const int q = stored_q(stored, b, e);
        if (slot_words(f))
            set_slot_quant(f, g + L.q, r, e, f == Format::kQ8_0 ? q + 128 : q);
        else if (f != Format::kQ8_0)
            g[L.q + kLanes * (e / 2) + r] |= static_cast<uint8_t>((q & 0x0F) << (4 * (e % 2)));
        if (L.fifth >= 0 && (q & 0x10)) {
            uint16_t bits;
            std::memcpy(&bits, g + L.fifth + 2 * e, 2);
            bits = static_cast<uint16_t>(bits | (1u << r));
            std::memcpy(g + L.fifth + 2 * e, &bits, 2);
        }
        if (L.hi >= 0) g[L.hi + kLanes * (e / 4) + r] |= static_cast<uint8_t>(((q >> 4) & 0x03) << (2 * (e % 4)));
    }
}

}  // namespace quant
}  // namespace rtp_llm
