// A linear layer's call on the CPU: which of its weight's copies serves these rows (device/cpu/linear.py chose
// the copies once, at load). The Python layers and the fused decoder layers both call this, so the rule that
// maps rows to a kernel exists once.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

#include "rtp_llm/cpp/cpu/ops.h"

namespace rtp_llm {
namespace {

// x @ W^T (+ b) with oneDNN's blocked weight copy (torch.ops.mkldnn._reorder_linear_weight's layout).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack{x, packed, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                            std::optional<std::string>(std::string())};
    op.callBoxed(&stack);
    return stack[0].toTensor();
}

bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined() && t->numel() > 0; }

}  // namespace

at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& plain, const std::optional<at::Tensor>& packed,
                  const std::optional<at::Tensor>& bias, int64_t n, int64_t gemv_max_rows) {
    const auto b = bias.has_value() && bias->defined() ? bias : std::nullopt;
    if (present(plain) && x.size(0) <= gemv_max_rows) return gemv(x, *plain, b);
    if (packed.has_value() && packed->defined()) {
        if (!packed->is_mkldnn() && packed->scalar_type() == at::kByte) return quant_linear(x, *packed, b, n);
        if (!packed->is_mkldnn() && packed->dim() == 3) return panel_linear(x, *packed, b, n);
        return onednn_linear(x, *packed, b);
    }
    TORCH_CHECK(present(plain), "linear: the layer has neither its weight nor a packed copy of it");
    return at::linear(x, *plain, b);
}

void linear_out(const at::Tensor& x, const std::optional<at::Tensor>& plain, const std::optional<at::Tensor>& packed,
                const std::optional<at::Tensor>& bias, int64_t n, int64_t gemv_max_rows, at::Tensor& out) {
    const bool gemv_rows = present(plain) && x.size(0) <= gemv_max_rows;
    if (!gemv_rows && packed.has_value() && packed->defined() && !packed->is_mkldnn()) {
        const auto b = bias.has_value() && bias->defined() ? bias : std::nullopt;
        if (packed->scalar_type() == at::kByte) return quant_linear_out(x, *packed, b, n, out);
        if (packed->dim() == 3) return panel_linear_out(x, *packed, b, n, out);
    }
    out.copy_(linear(x, plain, packed, bias, n, gemv_max_rows));
}

at::Tensor linear_silu(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t inter) {
    const auto b = bias.has_value() && bias->defined() ? bias : std::nullopt;
    if (!packed.is_mkldnn() && packed.scalar_type() == at::kByte) return quant_linear_silu(x, packed, b, inter);
    return panel_linear_silu(x, packed, b, inter);
}

}  // namespace rtp_llm
