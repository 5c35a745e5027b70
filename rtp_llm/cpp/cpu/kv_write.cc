// A step's new keys and values into the paged cache: row t goes to slot slots[t] of the layer's
// [2, num_blocks, block_size, kv_heads, head_dim] buffer, one memcpy per row and tensor.
//
// Why: the index_puts the torch path uses (cache.view(-1, heads, dim)[slots] = k, then v) go through the
// generic indexing machinery per tensor; a row copy per slot is what the write is. decoder_layers.cc calls the
// same function.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "rtp_llm/cpp/cpu/work_pool.h"
#include "rtp_llm/cpp/cpu/ops.h"

#include <cstring>

namespace rtp_llm {

void write_kv_rows(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots) {
    const int64_t n = rows.size(0), width = rows.numel() / std::max<int64_t>(n, 1);
    const int64_t bytes = width * rows.element_size(), src_stride = rows.stride(0) * rows.element_size();
    auto* dst = static_cast<char*>(cache.data_ptr());
    const auto* src = static_cast<const char*>(rows.data_ptr());
    parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) std::memcpy(dst + slots[t] * bytes, src + t * src_stride, bytes);
    });
}

namespace {

// Each row's kv_heads x head_dim values contiguous (rows may be strided: k and v are column slices of qkv).
bool rows_packed(const at::Tensor& x) {
    return x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2);
}

}  // namespace

void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor layer_kv, const at::Tensor& slots) {
    TORCH_CHECK(layer_kv.dim() == 5 && layer_kv.size(0) == 2 && layer_kv.is_contiguous(),
                "write_kv: layer_kv must be a contiguous [2, num_blocks, block_size, kv_heads, head_dim] cache");
    TORCH_CHECK(k.sizes() == v.sizes() && k.dim() == 3 && k.size(1) == layer_kv.size(3) &&
                    k.size(2) == layer_kv.size(4),
                "write_kv: k and v must be [tokens, kv_heads, head_dim] matching the cache, got ", k.sizes(), " and ",
                v.sizes());
    TORCH_CHECK(k.scalar_type() == layer_kv.scalar_type() && v.scalar_type() == layer_kv.scalar_type(),
                "write_kv: k, v and the cache must share a dtype");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.is_contiguous() &&
                    slots.size(0) == k.size(0),
                "write_kv: slots must be contiguous int64 [tokens]");
    const int64_t capacity = layer_kv.size(1) * layer_kv.size(2);
    const int64_t* sp = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < slots.size(0); ++t)
        TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "write_kv: slot ", sp[t], " outside [0, ", capacity, ")");
    auto kc = rows_packed(k) ? k : k.contiguous();
    auto vc = rows_packed(v) ? v : v.contiguous();
    auto k_cache = layer_kv.select(0, 0), v_cache = layer_kv.select(0, 1);
    write_kv_rows(kc, k_cache, sp);
    write_kv_rows(vc, v_cache, sp);
}

}  // namespace rtp_llm
