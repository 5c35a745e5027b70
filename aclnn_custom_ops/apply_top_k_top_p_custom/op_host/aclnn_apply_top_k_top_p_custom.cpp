// aclnnApplyTopKTopPCustom: sort each row (CANN's l0op::Sort, ascending, stable), cast the indices to
// int32, launch the AscendC kernel on (sorted values, indices, p, k), copy into `out`.
// Uses CANN's operator-development API (opdev / l0op); compiled by the CANN build only.
#include "aclnn_apply_top_k_top_p_custom.h"

#include "aclnn_kernels/cast.h"
#include "aclnn_kernels/contiguous.h"
#include "aclnn_kernels/sort.h"
#include "opdev/make_op_executor.h"
#include "opdev/op_dfx.h"
#include "opdev/op_executor.h"
#include "opdev/op_log.h"

namespace l0op {
// The L0 launcher of the custom kernel (inputs in OpDef order, then the output).
OP_TYPE_REGISTER(ApplyTopKTopPCustom);

static const aclTensor* ApplyTopKTopPCustom(const aclTensor* sorted, const aclTensor* indices, const aclTensor* p,
                                            const aclTensor* k, aclOpExecutor* executor) {
    auto out = executor->AllocTensor(sorted->GetViewShape(), sorted->GetDataType());
    auto ret = ADD_TO_LAUNCHER_LIST_AICORE(ApplyTopKTopPCustom, OP_INPUT(sorted, indices, p, k), OP_OUTPUT(out));
    return ret == ACLNN_SUCCESS ? out : nullptr;
}
}  // namespace l0op

extern "C" aclnnStatus aclnnApplyTopKTopPCustomGetWorkspaceSize(const aclTensor* logits, const aclTensor* p,
                                                                 const aclTensor* k, aclTensor* out,
                                                                 uint64_t* workspaceSize, aclOpExecutor** executor) {
    auto unique = CREATE_EXECUTOR();
    CHECK_RET(unique.get() != nullptr, ACLNN_ERR_INNER_CREATE_EXECUTOR);
    CHECK_RET(logits != nullptr && out != nullptr, ACLNN_ERR_PARAM_NULLPTR);
    CHECK_RET(logits->GetViewShape().GetDimNum() == 2, ACLNN_ERR_PARAM_INVALID);
    auto contiguous = l0op::Contiguous(logits, unique.get());
    CHECK_RET(contiguous != nullptr, ACLNN_ERR_INNER_NULLPTR);
    // ascending, stable: ties keep their order, as the documented algorithm requires
    auto sorted = l0op::Sort(contiguous, -1, false, true, op::DataType::DT_INT64, unique.get());
    const aclTensor* values = std::get<0>(sorted);
    const aclTensor* indices = l0op::Cast(std::get<1>(sorted), op::DataType::DT_INT32, unique.get());
    CHECK_RET(values != nullptr && indices != nullptr, ACLNN_ERR_INNER_NULLPTR);
    auto result = l0op::ApplyTopKTopPCustom(values, indices, p, k, unique.get());
    CHECK_RET(result != nullptr, ACLNN_ERR_INNER_NULLPTR);
    auto copied = l0op::ViewCopy(result, out, unique.get());
    CHECK_RET(copied != nullptr, ACLNN_ERR_INNER_NULLPTR);
    *workspaceSize = unique->GetWorkspaceSize();
    unique.ReleaseTo(executor);
    return ACLNN_SUCCESS;
}

extern "C" aclnnStatus aclnnApplyTopKTopPCustom(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                aclrtStream stream) {
    return CommonOpExecutorRun(workspace, workspaceSize, executor, stream);
}
