// The decode of quant_pack's group-blocks (quant_packed.h), written once for both vector widths:
// quant_linear_avx512.cc runs it on 16 lanes (a group-block's 16 rows at once, part h = 0), quant_linear_avx2.cc on
// 8 (part h: rows 8 h .. 8 h + 7). Each lane's arithmetic is the same at either width, so both give every weight
// exactly as quant::packed_value computes it.
//
// A group-block decodes in sections (those sharing their scales: the whole block, a k-quant's sub-block of 32, a
// Q6_K scale's 16 elements), each in units (the elements one load of quant bytes gives: 2 for a nibble byte, 4 for
// a Q6_K high-bits byte, 8 or 4 for a slot word of nibbles or bytes). Codec<V, F>::scales(g, s, h) gives section
// s's scale vectors, unit(g, sc, s, u, h, emit) calls emit(e, v) for the unit's elements in order, v = element e's
// rows (lanes). The few-row paths interleave units of several groups (so that their FMA chains overlap); the panel
// paths run them in order.
//
// V, the vector width's operations (each kernel file defines its own): types F (float lanes) and I (int32 lanes);
// halves / bytes / sbytes / words(p, h): part h of a per-row array of fp16 / uint8 / int8 / uint32 at p; set1,
// mul, sub, fmadd, fmsub, cvt (int to float), and_, rotl<by>, srli<by>, slli<by>; mask_or(v, mask, exponent): the
// float (v & mask) | exponent; add_one_where(v, bits, h): v + 1 in the lanes whose bit is set in the 16 row bits
// at `bits`; or16_where(q, bits, h): q | 16 there; or_masked(a, b, m): a | (b & m).
//
// Included once by each kernel file, which compiles it for its instruction set (the AVX-512 file under
// `#pragma GCC target`), so the templates carry no target of their own.
#pragma once

#include "rtp_llm/cpp/cpu/quant_packed.h"

namespace rtp_llm {
namespace quant {

template <class V>
struct Scales {
    typename V::F a, b;
};

template <class V, Format F>
struct Codec;

// Q8_0: slot words of bytes (quant_packed.h), a unit per word: the word and it rotated by 16 hold two elements'
// q + 128 each at bits 15 and 7; (word & the byte) | the exponent of 2^(15 - p) is 2^(15 - p) + (q + 128) / 256,
// and 256 d times that plus c_p (-384 d, -65664 d) is d q exactly.
template <class V>
struct Codec<V, Format::kQ8_0> {
    static constexpr PackedLayout L = packed_layout(Format::kQ8_0);
    static constexpr int kSections = 1, kUnits = 8;
    using Scales = quant::Scales<V>;  // a: 256 d; b: -384 d (c at bit 15), c at bit 7 made from it
    static inline Scales scales(const uint8_t* g, int, int h) {
        const auto d = V::halves(g + L.d, h);
        return {V::mul(d, V::set1(256.f)), V::mul(d, V::set1(-384.f))};
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int, int u, int h,
                                                           Emit&& emit) {
        const auto w = V::words(g + L.q + 64 * u, h);
        const typename V::I rotated[2] = {w, V::template rotl<16>(w)};
        // -65664 d = 171 (-384 d): exact (d has 11 significant bits, 171 eight)
        const auto c7 = V::mul(sc.b, V::set1(171.f));
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const int j = i % 2;  // slot: bit 15 - 8 j, exponent 127 + 8 j
            const auto f = V::mask_or(rotated[i / 2], 0xFF << (15 - 8 * j), (127 + 8 * j) << 23);
            emit(4 * u + i, V::fmadd(sc.a, f, j ? c7 : sc.b));
        }
    }
};

// Q4_0, Q4_1, Q5_0: slot words (quant_packed.h; Q5_0's fifth bits stored beside them), a unit per word: the word,
// and it rotated left by 12 and by 24, hold its 8 elements' nibbles at bits 19, 15, 11 (3, 3, 2). (word & the
// nibble) | the exponent of 2^(19 - p) is the float 2^(19 - p) + q / 16, so one scale 16 d serves every slot:
// 16 d f + c_p = d q + m exactly before the one rounding, with c_p = m - d 2^(23 - p) (Q4_0: -8 d - d 2^(23 - p);
// Q5_0: -16 d - d 2^(23 - p), its fifth bit adding 1 to f).
template <class V>
struct SlotScales {
    typename V::F d16, c[3];
};

template <class V, Format F>
struct SlotCodec {
    static constexpr PackedLayout L = packed_layout(F);
    static constexpr int kSections = 1, kUnits = 4;
    using Scales = SlotScales<V>;
    static inline Scales scales(const uint8_t* g, int, int h) {
        const auto d = V::halves(g + L.d, h);
        Scales sc;
        sc.d16 = V::mul(d, V::set1(16.f));
        for (int j = 0; j < 3; ++j) {
            const float step = static_cast<float>(1 << kSlotShift[j]);
            if constexpr (F == Format::kQ4_1) {  // m - d 2^s: exact, or quant_pack made the tensor Q5_1
                sc.c[j] = V::sub(V::halves(g + L.m, h), V::mul(d, V::set1(step)));
            } else {  // -(8 + 2^s) d, Q5_0 -(16 + 2^s) d: exact (at most 21 significant bits)
                sc.c[j] = V::mul(d, V::set1(-((F == Format::kQ5_0 ? 16.f : 8.f) + step)));
            }
        }
        return sc;
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int, int u, int h,
                                                           Emit&& emit) {
        const auto w = V::words(g + L.q + 64 * u, h);
        const typename V::I rotated[3] = {w, V::template rotl<12>(w), V::template rotl<24>(w)};
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const int j = i % 3;  // slot: bit 19 - 4 j, exponent 127 + 4 j
            auto v = V::mask_or(rotated[i / 3], 0xF << (19 - 4 * j), (127 + 4 * j) << 23);
            // Q5_0's fifth bit: + 16 / 16, exact (v's lowest bit is 2^-4 and it stays below 2^8)
            if constexpr (F == Format::kQ5_0) v = V::add_one_where(v, g + L.fifth + 2 * (8 * u + i), h);
            emit(8 * u + i, V::fmadd(sc.d16, v, sc.c[j]));
        }
    }
};

template <class V>
struct Codec<V, Format::kQ4_0> : SlotCodec<V, Format::kQ4_0> {};
template <class V>
struct Codec<V, Format::kQ4_1> : SlotCodec<V, Format::kQ4_1> {};
template <class V>
struct Codec<V, Format::kQ5_0> : SlotCodec<V, Format::kQ5_0> {};

// Q5_1, Q4_K, Q5_K: one section (the k-quants: 8), 16 nibble bytes of two elements each.
template <class V, Format F>
struct Codec {
    static_assert(F == Format::kQ5_1 || F == Format::kQ4_K || F == Format::kQ5_K, "the nibble formats");
    using Scales = quant::Scales<V>;
    static constexpr bool kK = F == Format::kQ4_K || F == Format::kQ5_K;
    static constexpr bool kFive = F == Format::kQ5_1 || F == Format::kQ5_K;
    static constexpr PackedLayout L = packed_layout(F);
    static constexpr int kSections = kK ? 8 : 1, kUnits = 16;
    static inline Scales scales(const uint8_t* g, int s, int h) {
        if constexpr (kK) {  // d * sc, dmin * m
            return {V::mul(V::halves(g + L.d, h), V::cvt(V::bytes(g + L.sc + 16 * s, h))),
                    V::mul(V::halves(g + L.m, h), V::cvt(V::bytes(g + L.mn + 16 * s, h)))};
        } else {
            return {V::halves(g + L.d, h), V::halves(g + L.m, h)};
        }
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int s, int u, int h,
                                                           Emit&& emit) {
        const int e0 = 32 * s + 2 * u;
        const auto bytes = V::bytes(g + L.q + 8 * e0, h);
        typename V::I q[2] = {V::and_(bytes, 0x0F), V::template srli<4>(bytes)};
        // Every product is exact (d: 11 significant bits, d sc: 17, q: 5 or 6), so one fused rounding gives gguf's
        // value; only an exact zero may come out as +0 where gguf has -0 (d < 0), which no FMA chain from +0 can
        // tell apart.
        for (int hh = 0; hh < 2; ++hh) {
            if constexpr (kFive) q[hh] = V::or16_where(q[hh], g + L.fifth + 2 * (e0 + hh), h);
            const auto qf = V::cvt(q[hh]);  // k-quants: (d sc) q - dmin m; Q5_1: d q + m
            emit(e0 + hh, kK ? V::fmsub(sc.a, qf, sc.b) : V::fmadd(sc.a, qf, sc.b));
        }
    }
};

template <class V>
struct Codec<V, Format::kQ6_K> {
    static constexpr PackedLayout L = packed_layout(Format::kQ6_K);
    using Scales = quant::Scales<V>;
    static constexpr int kSections = 16, kUnits = 4;  // 16 elements per scale, 4 per high-bits byte
    static inline Scales scales(const uint8_t* g, int t, int h) {
        const auto dsc = V::mul(V::halves(g + L.d, h), V::cvt(V::sbytes(g + L.sc + 16 * t, h)));
        return {dsc, V::mul(dsc, V::set1(-32.f))};  // -32 d sc: exact, a power of two
    }
    template <typename Emit>
    static __attribute__((always_inline)) inline void unit(const uint8_t* g, const Scales& sc, int t, int u, int h,
                                                           Emit&& emit) {
        const int e0 = 16 * t + 4 * u;
        const auto high = V::bytes(g + L.hi + 4 * e0, h);
        for (int p = 0; p < 2; ++p) {
            const auto bytes = V::bytes(g + L.q + 8 * (e0 + 2 * p), h);
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 2 * p + hh;  // the element's bits 4-5: high's bits 2j, 2j + 1, moved to 4-5
                const auto lo = hh ? V::template srli<4>(bytes) : V::and_(bytes, 0x0F);
                const auto moved = j == 0   ? V::template slli<4>(high)
                                   : j == 1 ? V::template slli<2>(high)
                                   : j == 2 ? high
                                            : V::template srli<2>(high);
                // d sc (q - 32) rounded once either way: d sc q - 32 d sc is the same exact value (the fused form
                // saves the subtraction; an exact zero may come out +0 for -0, as above)
                emit(e0 + j, V::fmadd(sc.a, V::cvt(V::or_masked(lo, moved, 0x30)), sc.b));
            }
        }
    }
};

}  // namespace quant
}  // namespace rtp_llm
