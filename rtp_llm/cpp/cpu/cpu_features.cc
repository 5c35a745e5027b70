#include "rtp_llm/cpp/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rtp_llm {

#if defined(__x86_64__) && defined(__GNUC__)

bool cpu_avx512() {
    static const bool on = [] {
        const char* off = std::getenv("RTP_LLM_CPU_NO_AVX512");
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               !(off && std::strcmp(off, "0") != 0);
    }();
    return on;
}

bool cpu_avx512_bf16() {
    static const bool on = cpu_avx512() && __builtin_cpu_supports("avx512bf16");
    return on;
}

bool cpu_amx_bf16() {
    static const bool on = [] {
        const char* off = std::getenv("RTP_LLM_CPU_NO_AMX");
        if (!cpu_avx512_bf16() || (off && std::strcmp(off, "0") != 0)) return false;
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
        // the OS saves the tile state (XCR0 bits 17, 18) and lets this process use it (Linux asks each process
        // to request the 8 KB of tile data: ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & (3u << 17)) != (3u << 17)) return false;
        constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
    }();
    return on;
}

#else  // not x86-64 with GCC/Clang: the portable kernels serve every CPU

bool cpu_avx512() { return false; }
bool cpu_avx512_bf16() { return false; }
bool cpu_amx_bf16() { return false; }

#endif

std::string cpu_isa() {
#ifdef __AVX2__
    return cpu_avx512() ? "avx512" : "avx2";
#else
    return cpu_avx512() ? "avx512" : "scalar";
#endif
}

}  // namespace rtp_llm
