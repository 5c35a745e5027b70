"""py_pytest: a Bazel py_test that runs one pytest file through tests/pytest_runner.py."""

def py_pytest(name, src, deps = [], data = [], size = "medium", tags = [], **kwargs):
    native.py_test(
        name = name,
        srcs = ["//tests:pytest_runner.py", src],
        main = "//tests:pytest_runner.py",
        args = ["$(rootpath %s)" % src],
        data = data + ["//tests:conftest"],
        deps = deps + ["//rtp_llm"],
        size = size,
        tags = tags,
        python_version = "PY3",
        **kwargs
    )
