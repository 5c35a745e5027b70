"""Build helpers shared by every package: device switches, compile flags, pybind extensions."""

load("@local_config_ascend//:build_defs.bzl", _if_ascend = "if_ascend")

def if_ascend(if_true, if_false = []):
    return _if_ascend(if_true, if_false)

def if_cuda(if_true, if_false = []):
    return select({
        "@//:using_cuda": if_true,
        "//conditions:default": if_false,
    })

def copts():
    """Warnings and device macros every C++ target of the project compiles with."""
    return ["-Wall", "-Wextra", "-Wno-unused-parameter"] + if_ascend(
        ["-DUSING_ASCEND=1", "-DUSE_C10D_HCCL"],
    ) + if_cuda(["-DTORCH_CUDA"])

def pybind_extension(name, srcs = [], deps = [], copts_extra = [], **kwargs):
    """A Python extension module `name`.so (cc_binary, linkshared) with hidden symbols.

    The shared object is built static against the project's C++ libraries, so it only needs libc,
    libstdc++ and the Python interpreter at import time.
    """
    native.cc_binary(
        name = name + ".so",
        srcs = srcs,
        deps = deps,
        copts = copts() + ["-fvisibility=hidden"] + copts_extra,
        linkshared = 1,
        linkstatic = 1,
        **kwargs
    )
