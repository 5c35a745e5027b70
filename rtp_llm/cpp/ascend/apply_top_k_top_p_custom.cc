// torch.ops.rtp_llm_npu.apply_top_k_top_p_custom: the AscendC operator of aclnn_custom_ops/, called
// through EXEC_NPU_CMD (libcust_opapi.so found via ASCEND_CUSTOM_OPP_PATH). It takes raw logits like
// npu_top_k_top_p: the rows are sorted here (torch_npu's stable sort, queued before the kernel on the
// same stream), and the operator gets (sorted values, int32 indices, p, k) as its OpDef declares.
#include <torch/library.h>

#include "rtp_llm/cpp/ascend/op_api_common.h"

namespace rtp_llm {
namespace ascend {

at::Tensor apply_top_k_top_p_custom(const at::Tensor& logits, const c10::optional<at::Tensor>& p,
                                    const c10::optional<at::Tensor>& k) {
    TORCH_CHECK(logits.dim() == 2, "logits must be [batch, vocab]");
    // ascending and stable: ties keep their order, as the kernel's algorithm requires
    auto sorted = at::sort(logits.contiguous(), /*stable=*/true, /*dim=*/-1, /*descending=*/false);
    at::Tensor values = std::get<0>(sorted);
    at::Tensor indices = std::get<1>(sorted).to(at::kInt);
    at::Tensor out = at::empty(logits.sizes(), logits.options());  // contiguous, whatever the logits' strides
    EXEC_NPU_CMD(aclnnApplyTopKTopPCustom, values, indices, p, k, out);
    return out;
}

// The entry points of an aclnn operator that no library on ASCEND_CUSTOM_OPP_PATH / CANN defines, asked once at
// load: another package's path (vllm-ascend sets it too) must not turn into an exception mid-request.
std::vector<std::string> missing_op_api_symbols(const std::string& api) { return op_api_libraries().missing(api); }

}  // namespace ascend
}  // namespace rtp_llm

TORCH_LIBRARY(rtp_llm_npu, m) {
    m.def("apply_top_k_top_p_custom(Tensor logits, Tensor? p, Tensor? k) -> Tensor");
    m.def("missing_op_api_symbols(str api) -> str[]", &rtp_llm::ascend::missing_op_api_symbols);
}

TORCH_LIBRARY_IMPL(rtp_llm_npu, PrivateUse1, m) {
    m.impl("apply_top_k_top_p_custom", &rtp_llm::ascend::apply_top_k_top_p_custom);
}
