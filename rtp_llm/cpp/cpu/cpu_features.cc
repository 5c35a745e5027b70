#include "rtp_llm/cpp/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

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

#else  // not x86-64 with GCC/Clang: the portable kernels serve every CPU

bool cpu_avx512() { return false; }
bool cpu_avx512_bf16() { return false; }

#endif

std::string cpu_isa() {
#ifdef __AVX2__
    return cpu_avx512() ? "avx512" : "avx2";
#else
    return cpu_avx512() ? "avx512" : "scalar";
#endif
}

}  // namespace rtp_llm
