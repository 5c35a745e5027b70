// The CPU kernels as C++ functions, for ops built from several of them (decode_layers.cc). Each is also a
// torch operator (torch.ops.rtp_llm.<name>), registered in its own file.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace rtp_llm {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// (norm(x + residual) * weight, x + residual)
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                 const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin);
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_table, const at::Tensor& kv_lens, double scale);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);
// cache.view(-1, row)[slots[t]] = rows[t] (kv_write.cc); each row's elements contiguous, rows may be strided.
void write_kv_rows(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots);
// A CPU tensor on 2 MB pages where the OS allows (huge_pages.cc): uninitialised / zeroed.
at::Tensor huge_page_empty(at::IntArrayRef sizes, at::ScalarType dtype);
at::Tensor huge_page_zeros(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace rtp_llm
