"""Finds the Python interpreter, its headers and pybind11, and registers a py_runtime for it.

Resolution: PYTHON_BIN_PATH, else python3 on PATH. pyenv shims are scripts, so the interpreter is
asked for its own sys.executable, which is what py_test's stub shebang must name.
"""

_PROBE = """
import sys, sysconfig
import pybind11
print(sys.executable)
print(sysconfig.get_paths()["include"])
print(pybind11.get_include())
print("%d.%d" % sys.version_info[:2])
"""

def _python_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH") or ctx.which("python3")
    if not python:
        fail("python_configure: no python3 on PATH and PYTHON_BIN_PATH is unset. " +
             "Run scripts/setup.sh or set PYTHON_BIN_PATH to the interpreter that has the pinned requirements.")
    res = ctx.execute([python, "-c", _PROBE])
    if res.return_code != 0:
        fail("python_configure: %s could not report its paths (is pybind11 installed? " % python +
             "run scripts/setup.sh):\n" + res.stderr)
    exe, py_include, pybind_include, version = res.stdout.strip().split("\n")
    ctx.symlink(py_include, "python_include")
    ctx.symlink(pybind_include, "pybind11_include")
    ctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/pybind11/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{exe}",
    python_version = "PY3",
    stub_shebang = "#!{exe}",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(exe = exe))
    ctx.file("defs.bzl", 'PYTHON_BIN = "%s"\nPYTHON_VERSION = "%s"\n' % (exe, version))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = ["PYTHON_BIN_PATH", "PATH"],
    local = True,
)
