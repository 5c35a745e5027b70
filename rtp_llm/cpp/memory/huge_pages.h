// Large long-lived CPU buffers (the KV cache, packed weights) on 2 MB pages where the OS allows it.
#pragma once

#include <ATen/ATen.h>

namespace rtp_llm {

// A CPU tensor on 2 MB pages (madvise(MADV_HUGEPAGE)): uninitialised / zeroed (the zeroing is the first touch,
// which is when the pages are chosen).
at::Tensor huge_page_empty(at::IntArrayRef sizes, at::ScalarType dtype);
at::Tensor huge_page_zeros(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace rtp_llm
