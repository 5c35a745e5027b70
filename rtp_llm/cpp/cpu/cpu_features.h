// What this CPU runs, decided once per process: the AVX-512 kernels (avx512f/bw/dq/vl) and their bf16 forms
// (avx512_bf16: vdpbf16ps; AMX bf16 tiles where present), or the AVX2 ones. RTP_LLM_CPU_NO_AVX512=1 in the environment selects what a CPU
// without AVX-512 runs, so that one machine tests both.
#pragma once

#include <string>

namespace rtp_llm {

bool cpu_avx512();
bool cpu_avx512_bf16();  // cpu_avx512() and the bf16 dot products
// cpu_avx512_bf16() and AMX's bf16 tiles (amx_tile, amx_bf16), enabled by the kernel for this process
// (arch_prctl XTILEDATA); RTP_LLM_CPU_NO_AMX=1 runs the avx512_bf16 kernels instead.
bool cpu_amx_bf16();
// "avx512", "avx2" or "scalar": the instruction set the kernels of this process use.
std::string cpu_isa();

}  // namespace rtp_llm
