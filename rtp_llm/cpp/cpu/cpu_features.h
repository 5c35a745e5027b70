// What this CPU runs, decided once per process: the AVX-512 kernels (avx512f/bw/dq/vl) and their bf16 forms
// (avx512_bf16: vdpbf16ps), or the AVX2 ones. RTP_LLM_CPU_NO_AVX512=1 in the environment selects what a CPU
// without AVX-512 runs, so that one machine tests both.
#pragma once

#include <string>

namespace rtp_llm {

bool cpu_avx512();
bool cpu_avx512_bf16();  // cpu_avx512() and the bf16 dot products
// "avx512", "avx2" or "scalar": the instruction set the kernels of this process use.
std::string cpu_isa();

}  // namespace rtp_llm
