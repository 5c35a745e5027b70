// Where an aclnn operator's two entry points (aclnnXGetWorkspaceSize, aclnnX) come from, without linking CANN:
// dlopen/dlsym over, in order, each entry of ASCEND_CUSTOM_OPP_PATH (':'-separated, earlier wins:
// <entry>/op_api/lib/libcust_opapi.so, this project's AscendC operators and any other vendor's package),
// then libopapi.so (CANN's aclnn operators), then libnnopbase.so (aclCreateTensor and the other meta calls).
// Plain C++ (no CANN or torch_npu header), so its lookups are tested on any machine with stub libraries.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace rtp_llm {
namespace ascend {

class OpApiLibraries {
public:
    // custom_paths: ASCEND_CUSTOM_OPP_PATH's value; system: also CANN's libopapi.so and libnnopbase.so
    explicit OpApiLibraries(const std::string& custom_paths, bool system = true) {
        std::stringstream ss(custom_paths);
        std::string entry;
        while (std::getline(ss, entry, ':')) {
            if (entry.empty()) continue;
            const std::string lib = entry + "/op_api/lib/libcust_opapi.so";
            if (void* h = dlopen(lib.c_str(), RTLD_LAZY | RTLD_GLOBAL)) handles_.push_back(h);
        }
        if (!system) return;
        for (const char* lib : {"libopapi.so", "libnnopbase.so"}) {
            if (void* h = dlopen(lib, RTLD_LAZY | RTLD_GLOBAL)) handles_.push_back(h);
        }
    }

    // The first library that defines `name`, else nullptr; lookups are cached.
    void* symbol(const std::string& name) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = cache_.find(name);
        if (it != cache_.end()) return it->second;
        void* found = nullptr;
        for (void* h : handles_) {
            if ((found = dlsym(h, name.c_str())) != nullptr) break;
        }
        cache_.emplace(name, found);
        return found;
    }

    // The entry points of aclnn operator `api` that no library defines (empty: the operator can run).
    std::vector<std::string> missing(const std::string& api) {
        std::vector<std::string> out;
        for (const std::string& name : {api + "GetWorkspaceSize", api}) {
            if (symbol(name) == nullptr) out.push_back(name);
        }
        return out;
    }

    size_t loaded() const { return handles_.size(); }

private:
    std::vector<void*> handles_;
    std::mutex mu_;
    std::unordered_map<std::string, void*> cache_;
};

// The process's libraries, opened at first use from the environment.
inline OpApiLibraries& op_api_libraries() {
    static OpApiLibraries libs(std::getenv("ASCEND_CUSTOM_OPP_PATH") ? std::getenv("ASCEND_CUSTOM_OPP_PATH") : "");
    return libs;
}

inline void* op_api_symbol(const std::string& name) { return op_api_libraries().symbol(name); }

}  // namespace ascend
}  // namespace rtp_llm
