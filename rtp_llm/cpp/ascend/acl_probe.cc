// The smallest piece of the NPU bridge: asks the ACL runtime how many NPUs are visible.
// Built only under --config=ascend (it depends on @local_config_ascend//:ascend, which is
// incompatible with every other configuration). The bridge for torch_npu ops (op_api_common.h,
// EXEC_NPU_CMD) joins this folder with the Ascend backend.
#include <acl/acl.h>

#include <cstdint>

extern "C" __attribute__((visibility("default"))) int rtp_llm_ascend_device_count() {
    uint32_t count = 0;
    if (aclrtGetDeviceCount(&count) != ACL_SUCCESS) return -1;
    return static_cast<int>(count);
}
