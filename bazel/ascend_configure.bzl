"""Configures the Huawei CANN toolkit for --config=ascend.

TF_NEED_ASCEND != "1": a stub repository whose targets are incompatible with every platform, so
`bazel build //...` on CPU/CUDA skips Ascend-only targets. TF_NEED_ASCEND == "1": the toolkit, found as
ASCEND_TOOLKIT_PATH, else what CANN's set_env.sh exports (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME), else the
root install /usr/local/Ascend/ascend-toolkit/latest, else a user's $HOME/Ascend/ascend-toolkit/latest, must
hold include/acl/acl.h and lib64/libascendcl.so, else the build stops at once with a message that says what
is missing. The path found is ASCEND_TOOLKIT_PATH in build_defs.bzl: the custom-operator build gets it from there.
"""

_DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"
_ENV_TOOLKIT = ["ASCEND_TOOLKIT_PATH", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"]

def _find_toolkit(ctx):
    for var in _ENV_TOOLKIT:
        if ctx.os.environ.get(var):
            return ctx.os.environ[var]
    home = ctx.os.environ.get("HOME", "")
    if not ctx.path(_DEFAULT_TOOLKIT).exists and home and ctx.path(home + "/Ascend/ascend-toolkit/latest").exists:
        return home + "/Ascend/ascend-toolkit/latest"
    return _DEFAULT_TOOLKIT

_REQUIRED = ["include/acl/acl.h", "lib64/libascendcl.so"]

_BUILD_DEFS = """
def if_ascend(if_true, if_false = []):
    \"\"\"Selects if_true under --config=ascend.\"\"\"
    return select({{
        "@//:using_ascend": if_true,
        "//conditions:default": if_false,
    }})

ASCEND_ENABLED = {enabled}
ASCEND_TOOLKIT_PATH = "{path}"
"""

_TORCH_NPU_PROBE = """
import importlib.util, os
spec = importlib.util.find_spec("torch_npu")
print(os.path.dirname(spec.origin) if spec and spec.origin else "")
"""

def _stub(ctx):
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# CANN is not configured (TF_NEED_ASCEND != 1): these targets are skipped by //... .
cc_library(name = "ascend_headers", target_compatible_with = ["@//bazel:sdk_missing"])
cc_library(name = "ascend", target_compatible_with = ["@//bazel:sdk_missing"])
cc_library(name = "hccl", target_compatible_with = ["@//bazel:sdk_missing"])
cc_library(name = "torch_npu", target_compatible_with = ["@//bazel:sdk_missing"])
""")
    ctx.file("build_defs.bzl", _BUILD_DEFS.format(enabled = "False", path = ""))

def _ascend_configure_impl(ctx):
    if ctx.os.environ.get("TF_NEED_ASCEND", "0") != "1":
        _stub(ctx)
        return
    toolkit = _find_toolkit(ctx)
    missing = [f for f in _REQUIRED if not ctx.path(toolkit + "/" + f).exists]
    if missing:
        fail(("\n--config=ascend needs the Huawei CANN toolkit, but %s is missing %s.\n" +
              "  * Install CANN (toolkit + kernels) and `source <install>/set_env.sh`, or\n" +
              "  * set ASCEND_TOOLKIT_PATH to the toolkit folder that holds include/acl/acl.h and lib64/libascendcl.so\n" +
              "    (e.g. `bazel build --config=ascend --repo_env=ASCEND_TOOLKIT_PATH=/path/to/ascend-toolkit/latest //...`), or\n" +
              "  * build for this machine's CPU instead: `bazel build --config=cpu //...` (the default).") %
             (toolkit, " and ".join(missing)))
    ctx.symlink(toolkit + "/include", "include")
    ctx.symlink(toolkit + "/lib64", "lib64")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "ascend_headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)

# libascendcl (ACL runtime). Linked dynamically from the toolkit: the runtime must be the installed one.
cc_library(
    name = "ascend",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lascendcl"],
    deps = [":ascend_headers"],
)

cc_library(
    name = "hccl",
    linkopts = ["-L{lib}", "-lhccl"],
    deps = [":ascend"],
)

""".format(lib = toolkit + "/lib64") + _torch_npu_build(ctx))
    ctx.file("build_defs.bzl", _BUILD_DEFS.format(enabled = "True", path = toolkit))

def _torch_npu_build(ctx):
    """torch_npu's C++ headers and libtorch_npu.so from the pip package, found without importing it
    (importing needs the CANN runtime). Absent: the target is skipped, with the reason in its name."""
    python = ctx.os.environ.get("PYTHON_BIN_PATH") or ctx.which("python3")
    res = ctx.execute([python, "-c", _TORCH_NPU_PROBE]) if python else None
    pkg = res.stdout.strip() if res and res.return_code == 0 else ""
    if not pkg or not ctx.path(pkg + "/include").exists:
        return """
# torch_npu (pip) not found: targets that need its C++ API are skipped.
cc_library(name = "torch_npu", target_compatible_with = ["@//bazel:sdk_missing"])
"""
    ctx.symlink(pkg + "/include", "torch_npu_include")
    return """
cc_library(
    name = "torch_npu",
    hdrs = glob(["torch_npu_include/**/*.h"]),
    includes = ["torch_npu_include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-ltorch_npu"],
    deps = [":ascend", "@local_config_torch//:torch"],
)
""".format(lib = pkg + "/lib")

ascend_configure = repository_rule(
    implementation = _ascend_configure_impl,
    environ = ["TF_NEED_ASCEND", "PYTHON_BIN_PATH", "HOME"] + _ENV_TOOLKIT,
    local = True,
)
