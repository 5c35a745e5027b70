// aclnn interface of ApplyTopKTopPCustom, the two-phase form every aclnn operator has:
//   aclnnApplyTopKTopPCustomGetWorkspaceSize(logits, p, k, out, &workspaceSize, &executor)
//   aclnnApplyTopKTopPCustom(workspace, workspaceSize, executor, stream)
// It takes raw logits: the row sort (ascending, with int32 indices) runs first, then the kernel.
// p and k are optional (nullptr = no top-p / no top-k).
#ifndef ACLNN_APPLY_TOP_K_TOP_P_CUSTOM_H
#define ACLNN_APPLY_TOP_K_TOP_P_CUSTOM_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

__attribute__((visibility("default"))) aclnnStatus aclnnApplyTopKTopPCustomGetWorkspaceSize(
    const aclTensor* logits, const aclTensor* p, const aclTensor* k, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);

__attribute__((visibility("default"))) aclnnStatus aclnnApplyTopKTopPCustom(void* workspace, uint64_t workspaceSize,
                                                                              aclOpExecutor* executor,
                                                                              aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // ACLNN_APPLY_TOP_K_TOP_P_CUSTOM_H
