// rtp_llm._C: the project's one extension module.
#include <pybind11/pybind11.h>

#include "rtp_llm/cpp/pybind/bindings.h"

PYBIND11_MODULE(_C, m) {
    m.doc() = "rtp-llm C++ runtime: the device-neutral KV-cache core";
    rtp_llm::bind_cache(m);
}
