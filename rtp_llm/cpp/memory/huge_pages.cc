// Why: the decode kernels stream these buffers, and with 4 KB pages every 4 KB is a TLB miss and a restart of
// the hardware stream prefetchers (which stop at page boundaries); benchmarks.cpu_decode_attention measures it.
// Machines often ship transparent huge pages as "madvise": they must be asked for, per range, before the memory
// is first touched.
#include "rtp_llm/cpp/memory/huge_pages.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace rtp_llm {

at::Tensor huge_page_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
    constexpr size_t kHuge = size_t{2} << 20;
    int64_t numel = 1;
    for (const int64_t s : sizes) {
        TORCH_CHECK(s >= 0, "huge_page_empty: negative size ", s);
        numel *= s;
    }
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    const size_t rounded = std::max(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    void* p = nullptr;
    TORCH_CHECK(posix_memalign(&p, kHuge, rounded) == 0, "huge_page_empty: cannot allocate ", rounded, " bytes");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, rounded, MADV_HUGEPAGE);  // advice: where huge pages are off or exhausted, 4 KB pages serve
#endif
    return at::from_blob(p, sizes, [](void* q) { std::free(q); }, at::TensorOptions().dtype(dtype));
}

at::Tensor huge_page_zeros(at::IntArrayRef sizes, at::ScalarType dtype) {
    auto t = huge_page_empty(sizes, dtype);
    auto* p = static_cast<char*>(t.data_ptr());
    const int64_t bytes = t.numel() * t.element_size();
    // First touch, which is when the pages are chosen; all threads, since a 1 GB cache takes a while.
    at::parallel_for(0, bytes, int64_t{1} << 22, [&](int64_t b, int64_t e) { std::memset(p + b, 0, e - b); });
    return t;
}

}  // namespace rtp_llm
