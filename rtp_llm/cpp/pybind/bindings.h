// Each part of the C++ runtime adds its classes to the one extension module through a bind_* function.
#pragma once

#include <pybind11/pybind11.h>

namespace rtp_llm {
void bind_cache(pybind11::module_& m);
}  // namespace rtp_llm
