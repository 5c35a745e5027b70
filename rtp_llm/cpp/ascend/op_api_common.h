// Calling aclnn operators from C++ without linking them: EXEC_NPU_CMD(aclnnX, args...).
//
// Nothing of CANN's operator stack is linked (torch_npu does not link libopapi / libnnopbase either):
// every function comes from dlopen/dlsym, from the first library that defines it (op_api_symbols.h).
// aclnnXGetWorkspaceSize(args..., &workspace_size, &executor) runs on the calling thread; the launch
// aclnnX(workspace, size, executor, stream) is submitted through torch_npu's task queue
// (OpCommand::RunOpApiV2, as op-plugin does), so it runs after the queued ops that produce its inputs.
//
// Built only with --config=ascend (it needs torch_npu's headers, which carry CANN's acl headers).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <acl/acl.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

#include "rtp_llm/cpp/ascend/op_api_symbols.h"

// Opaque aclnn meta types (CANN's aclnn/acl_meta.h declares the same names; it is not shipped with torch_npu).
typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclIntArray aclIntArray;

namespace rtp_llm {
namespace ascend {

// The meta functions of libnnopbase, by the signatures aclnn/acl_meta.h gives them.
using AclCreateTensor = aclTensor* (*)(const int64_t* view_dims, uint64_t view_dims_num, aclDataType dtype,
                                       const int64_t* stride, int64_t offset, aclFormat format,
                                       const int64_t* storage_dims, uint64_t storage_dims_num, void* data);
using AclDestroyTensor = int (*)(const aclTensor*);
using AclCreateIntArray = aclIntArray* (*)(const int64_t* value, uint64_t size);
using AclDestroyIntArray = int (*)(const aclIntArray*);
using AclnnLaunch = int (*)(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, aclrtStream stream);

// aclGetRecentErrMsg from the ACL runtime torch_npu has loaded (looked up, not linked: the bridge links nothing of
// CANN), for the device's own account of a failure.
inline std::string recent_acl_error() {
    using GetMsg = const char* (*)();
    static const auto get = reinterpret_cast<GetMsg>(dlsym(RTLD_DEFAULT, "aclGetRecentErrMsg"));
    const char* msg = get ? get() : nullptr;
    return msg && *msg ? std::string("; CANN: ") + msg : std::string();
}

template <typename Fn>
Fn required_symbol(const std::string& name) {
    void* p = op_api_symbol(name);
    if (p == nullptr) {
        throw std::runtime_error(name + " not found in $ASCEND_CUSTOM_OPP_PATH/op_api/lib/libcust_opapi.so, "
                                        "libopapi.so or libnnopbase.so (is the operator package installed and "
                                        "CANN's set_env.sh sourced?)");
    }
    return reinterpret_cast<Fn>(p);
}

inline aclDataType acl_dtype(at::ScalarType t) {
    switch (t) {
        case at::kFloat: return ACL_FLOAT;
        case at::kHalf: return ACL_FLOAT16;
        case at::kBFloat16: return ACL_BF16;
        case at::kInt: return ACL_INT32;
        case at::kLong: return ACL_INT64;
        case at::kBool: return ACL_BOOL;
        case at::kChar: return ACL_INT8;
        case at::kByte: return ACL_UINT8;
        default: throw std::invalid_argument(std::string("no aclDataType for ") + at::toString(t));
    }
}

// at::Tensor -> aclTensor describing the same memory (view shape/strides over the whole storage).
inline aclTensor* to_acl(const at::Tensor& t) {
    if (!t.defined()) return nullptr;
    static const auto create = required_symbol<AclCreateTensor>("aclCreateTensor");
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
    int64_t storage_elems = static_cast<int64_t>(t.storage().nbytes() / t.itemsize());
    return create(shape.data(), shape.size(), acl_dtype(t.scalar_type()), strides.data(), t.storage_offset(),
                  ACL_FORMAT_ND, &storage_elems, 1, const_cast<void*>(t.storage().data()));
}
inline aclTensor* to_acl(const c10::optional<at::Tensor>& t) { return t.has_value() ? to_acl(*t) : nullptr; }
inline aclIntArray* to_acl(at::IntArrayRef a) {
    static const auto create = required_symbol<AclCreateIntArray>("aclCreateIntArray");
    return create(a.data(), a.size());
}
inline double to_acl(double v) { return v; }
inline int64_t to_acl(int64_t v) { return v; }
inline bool to_acl(bool v) { return v; }

inline void release(aclTensor* t) {
    static const auto destroy = required_symbol<AclDestroyTensor>("aclDestroyTensor");
    if (t) destroy(t);
}
inline void release(aclIntArray* a) {
    static const auto destroy = required_symbol<AclDestroyIntArray>("aclDestroyIntArray");
    if (a) destroy(a);
}
template <typename T>
inline void release(T) {}

template <typename... Args>
void exec_npu_cmd(const char* api, const Args&... args) {
    using Converted = std::tuple<decltype(to_acl(args))...>;
    using GetWorkspace = int (*)(decltype(to_acl(args))..., uint64_t*, aclOpExecutor**);
    const std::string name(api);
    const auto get_ws = required_symbol<GetWorkspace>(name + "GetWorkspaceSize");
    const auto launch = required_symbol<AclnnLaunch>(name);
    // Shared so the queued launch (which may run on torch_npu's dequeue thread) releases them.
    auto converted = std::make_shared<Converted>(to_acl(args)...);
    auto release_all = [](Converted& c) { std::apply([](auto&... x) { (release(x), ...); }, c); };
    uint64_t workspace_size = 0;
    aclOpExecutor* executor = nullptr;
    int ret = std::apply([&](auto&... c) { return get_ws(c..., &workspace_size, &executor); }, *converted);
    if (ret != 0) {
        release_all(*converted);
        throw std::runtime_error(name + "GetWorkspaceSize failed with aclnn status " + std::to_string(ret) +
                                 recent_acl_error());
    }
    at::Tensor workspace;  // from torch's caching allocator on the current NPU; kept alive by the launch
    if (workspace_size > 0) {
        workspace = at::empty({static_cast<int64_t>(workspace_size)},
                              at::TensorOptions().dtype(at::kByte).device(at::kPrivateUse1));
    }
    const aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
    auto run = [converted, release_all, workspace, workspace_size, executor, stream, launch]() -> int {
        void* ws = workspace.defined() ? const_cast<void*>(workspace.storage().data()) : nullptr;
        int status = launch(ws, workspace_size, executor, stream);
        release_all(*converted);
        return status;
    };
    at_npu::native::OpCommand::RunOpApiV2(name, run);
}

}  // namespace ascend
}  // namespace rtp_llm

#define EXEC_NPU_CMD(aclnn_api, ...) ::rtp_llm::ascend::exec_npu_cmd(#aclnn_api, __VA_ARGS__)
