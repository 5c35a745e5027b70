"""Exposes the pip-installed torch (headers, libraries, ABI flag) to C++ targets.

Torch extensions use torch's bundled pybind11 (in torch/include), not the pip pybind11, so that
the two agree on type casters.
"""

_PROBE = """
import torch
from torch.utils import cpp_extension
print(cpp_extension.include_paths()[0])
print(cpp_extension.library_paths()[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
"""

def _torch_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH") or ctx.which("python3")
    res = ctx.execute([python, "-c", _PROBE]) if python else None
    if res == None or res.return_code != 0:
        # torch is only needed by torch extensions; a BUILD that says so keeps the rest buildable.
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "torch", target_compatible_with = ["@//bazel:sdk_missing"])
""")
        return
    include, libdir, abi, version = res.stdout.strip().split("\n")
    ctx.symlink(include, "include")
    ctx.symlink(libdir, "lib")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# torch {version}
cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"],
    copts = ["-Wno-c++20-extensions"],
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"],
    deps = ["@local_config_python//:python_headers"],
)
""".format(abi = abi, libdir = libdir, version = version))

torch_configure = repository_rule(
    implementation = _torch_configure_impl,
    environ = ["PYTHON_BIN_PATH", "PATH"],
    local = True,
)
