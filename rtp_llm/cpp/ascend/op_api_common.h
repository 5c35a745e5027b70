// Calling aclnn operators from C++ without linking them: EXEC_NPU_CMD(aclnnX, args...).
//
// The operator libraries are opened at run time, in this order:
//   1. each entry of ASCEND_CUSTOM_OPP_PATH (':'-separated, earlier wins): <entry>/op_api/lib/libcust_opapi.so
//      (this project's AscendC operators, see aclnn_custom_ops/);
//   2. CANN's libopapi.so (the built-in aclnn operators).
// aclnnXGetWorkspaceSize(args..., &workspace_size, &executor) and aclnnX(workspace, size, executor,
// stream) are resolved by name; the workspace is a byte tensor from torch's caching allocator on the
// current NPU, and the operator is submitted on torch_npu's current stream, so it orders with the
// surrounding torch work.
//
// Built only with --config=ascend (it needs CANN's headers and torch_npu's).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <acl/acl.h>
#include <aclnn/acl_meta.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace rtp_llm {
namespace ascend {

inline std::vector<void*> open_op_api_libraries() {
    std::vector<void*> handles;
    if (const char* paths = std::getenv("ASCEND_CUSTOM_OPP_PATH")) {
        std::stringstream ss(paths);
        std::string entry;
        while (std::getline(ss, entry, ':')) {
            if (entry.empty()) continue;
            const std::string lib = entry + "/op_api/lib/libcust_opapi.so";
            if (void* h = dlopen(lib.c_str(), RTLD_LAZY | RTLD_GLOBAL)) handles.push_back(h);
        }
    }
    if (void* h = dlopen("libopapi.so", RTLD_LAZY | RTLD_GLOBAL)) handles.push_back(h);
    return handles;
}

// The first library that defines `name` wins; nullptr when none does. Lookups are cached.
inline void* op_api_symbol(const std::string& name) {
    static std::mutex mu;
    static std::vector<void*> handles = open_op_api_libraries();
    static std::unordered_map<std::string, void*> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    void* found = nullptr;
    for (void* h : handles) {
        if ((found = dlsym(h, name.c_str())) != nullptr) break;
    }
    cache.emplace(name, found);
    return found;
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
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
    int64_t storage_elems = static_cast<int64_t>(t.storage().nbytes() / t.itemsize());
    return aclCreateTensor(shape.data(), shape.size(), acl_dtype(t.scalar_type()), strides.data(),
                           t.storage_offset(), ACL_FORMAT_ND, &storage_elems, 1,
                           const_cast<void*>(t.storage().data()));
}
inline aclTensor* to_acl(const c10::optional<at::Tensor>& t) { return t.has_value() ? to_acl(*t) : nullptr; }
inline aclIntArray* to_acl(at::IntArrayRef a) { return aclCreateIntArray(a.data(), a.size()); }
inline double to_acl(double v) { return v; }
inline int64_t to_acl(int64_t v) { return v; }
inline bool to_acl(bool v) { return v; }

inline void release(aclTensor* t) {
    if (t) aclDestroyTensor(t);
}
inline void release(aclIntArray* a) {
    if (a) aclDestroyIntArray(a);
}
template <typename T>
inline void release(T) {}

template <typename... Args>
void exec_npu_cmd(const char* api, const Args&... args) {
    using Converted = std::tuple<decltype(to_acl(args))...>;
    using GetWorkspace = int (*)(decltype(to_acl(args))..., uint64_t*, aclOpExecutor**);
    using Run = int (*)(void*, uint64_t, aclOpExecutor*, aclrtStream);
    const std::string name(api);
    auto get_ws = reinterpret_cast<GetWorkspace>(op_api_symbol(name + "GetWorkspaceSize"));
    auto run = reinterpret_cast<Run>(op_api_symbol(name));
    if (get_ws == nullptr || run == nullptr) {
        throw std::runtime_error(name + " not found: looked in $ASCEND_CUSTOM_OPP_PATH/op_api/lib/libcust_opapi.so "
                                        "and libopapi.so (is the operator package installed and the CANN env sourced?)");
    }
    Converted converted(to_acl(args)...);
    uint64_t workspace_size = 0;
    aclOpExecutor* executor = nullptr;
    int ret = std::apply([&](auto&... c) { return get_ws(c..., &workspace_size, &executor); }, converted);
    if (ret != 0) {
        std::apply([](auto&... c) { (release(c), ...); }, converted);
        throw std::runtime_error(name + "GetWorkspaceSize failed with aclnn status " + std::to_string(ret));
    }
    at::Tensor workspace;
    void* workspace_ptr = nullptr;
    if (workspace_size > 0) {
        workspace = at::empty({static_cast<int64_t>(workspace_size)},
                              at::TensorOptions().dtype(at::kByte).device(at::kPrivateUse1));
        workspace_ptr = workspace.data_ptr();
    }
    aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
    ret = run(workspace_ptr, workspace_size, executor, stream);
    std::apply([](auto&... c) { (release(c), ...); }, converted);
    if (ret != 0) throw std::runtime_error(name + " failed with aclnn status " + std::to_string(ret));
}

}  // namespace ascend
}  // namespace rtp_llm

#define EXEC_NPU_CMD(aclnn_api, ...) ::rtp_llm::ascend::exec_npu_cmd(#aclnn_api, __VA_ARGS__)
