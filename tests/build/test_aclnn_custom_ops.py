"""Static checks of the AscendC operator project (aclnn_custom_ops/) for what CANN and the AI core would
reject or run wrong, on a machine with neither: bisheng and CANN's op-package build cannot run here.

- every tiling key the host plan can return has its TILING_KEY_IS branch in the kernel (CANN compiles one
  kernel per key; a key without a branch has no binary to launch);
- the kernel never writes global memory with GlobalTensor::SetValue without DataCacheCleanAndInvalid (the
  scalar write stays in the core's data cache and goes out by 64-byte line);
- scalar reads of UB after vector work wait on a V->S event (PipeBarrier<PIPE_V> orders the vector pipe
  only), and vector work after scalar UB writes waits on S->V;
- ToFloat is applied to bfloat16_t values only (AscendC defines it for bfloat16_t);
- op_host includes only headers that exist (this project's, the C++ library's, or CANN's, named below with
  the symbols each declares) and includes the header of every CANN symbol it uses;
- nothing builds host code as C++11 (CANN's opbase headers need C++17);
- the op's msopgen description, its OpDef, the kernel's entry and the torch bridge's call agree.
With CANN's headers present (CANN_INCLUDE or ASCEND_TOOLKIT_PATH), op_host is also compiled (-fsyntax-only).
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "aclnn_custom_ops"
OPS = [p.parent.name for p in PKG.glob("*/op_kernel") if p.is_dir()]
BRIDGE = ROOT / "rtp_llm" / "cpp" / "ascend"

# CANN headers op_host / op_kernel may include, with the symbols that need them (CANN 8.x op development
# guide: "Host侧tiling实现", "算子原型定义", "平台信息获取"; AscendC API reference for kernel_operator.h).
CANN_HEADERS = {
    "register/op_def_registry.h": ["OpDef", "OP_ADD", "gert::TilingContext", "gert::InferShapeContext",
                                   "gert::InferDataTypeContext", "ge::graphStatus"],
    "register/tilingdata_base.h": ["BEGIN_TILING_DATA_DEF", "TILING_DATA_FIELD_DEF", "REGISTER_TILING_DATA_CLASS"],
    "tiling/platform/platform_ascendc.h": ["platform_ascendc::"],
    "kernel_operator.h": ["GlobalTensor", "LocalTensor", "TPipe", "GET_TILING_DATA"],
}
STD_HEADERS = {"cstdint", "cmath", "limits", "vector", "algorithm", "cstring", "cstddef", "numeric", "string"}


def sources(op, part, exts=(".cpp", ".h")):
    return sorted(p for p in (PKG / op / part).iterdir() if p.suffix in exts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def kernel(op):
    return strip_comments((PKG / op / "op_kernel" / f"{op}.cpp").read_text())


def functions(text):
    """(name, body) of each function definition: a name(...) followed by a brace block."""
    out = []
    for m in re.finditer(r"(\w+)\s*\([^;{}]*\)\s*(?:const\s*)?\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.group(1), text[m.end():i - 1]))
    return [(n, b) for n, b in out if n not in {"if", "for", "while", "switch"}]


@pytest.mark.parametrize("op", OPS)
def test_every_tiling_key_has_its_kernel_branch(op):
    plan = "\n".join(strip_comments(h.read_text()) for h in sources(op, "op_host", exts=(".h",)))
    enum = re.search(r"enum\s+TilingKey[^{]*\{([^}]*)\}", plan)
    assert enum, "the tiling plan declares its keys in enum TilingKey"
    keys = {int(v) for v in re.findall(r"=\s*(\d+)", enum.group(1))}
    branches = {int(v) for v in re.findall(r"TILING_KEY_IS\(\s*(\d+)\s*\)", kernel(op))}
    assert keys and keys <= branches, f"tiling keys without a TILING_KEY_IS branch: {sorted(keys - branches)}"
    assert branches <= keys, f"branches for keys the tiling never returns: {sorted(branches - keys)}"


@pytest.mark.parametrize("op", OPS)
def test_global_memory_scalar_writes_are_flushed(op):
    text = kernel(op)
    gm = set()
    for decl in re.findall(r"GlobalTensor<[^>]+>\s+([\w\s,]+);", text):
        gm.update(n.strip() for n in decl.split(","))
    for name, body in functions(text):
        for g in gm:
            if re.search(rf"\b{g}\s*(\[[^\]]*\])?\s*\.SetValue\(", body):
                assert "DataCacheCleanAndInvalid" in body, \
                    f"{name}: {g}.SetValue without DataCacheCleanAndInvalid (or write it with DataCopyPad)"


VECTOR_OPS = r"\b(Cast|Adds|Muls|Exp|Ln|ReduceSum|ReduceMax|Duplicate|Compare|CompareScalar|Select|Div|Add|Sub|Mul|" \
             r"Maxs|Mins|CumSum|Brcb|DataCopy)\s*[<(]"


def pipe_events(body, local_names):
    """The body's pipe-relevant events in source order: vector op, scalar UB read/write, and syncs."""
    names = "|".join(map(re.escape, local_names)) or r"\b\B"
    pattern = re.compile(
        rf"(?P<vs>WaitPipe<HardEvent::V_S>|WaitFlag<HardEvent::V_S>)|(?P<sv>WaitPipe<HardEvent::S_V>|"
        rf"WaitFlag<HardEvent::S_V>)|(?P<all>PipeBarrier<PIPE_ALL>)|(?P<read>\b(?:{names})\.GetValue\()|"
        rf"(?P<write>\b(?:{names})\.SetValue\()|(?P<vec>{VECTOR_OPS})")
    return [m.lastgroup for m in pattern.finditer(body)]


@pytest.mark.parametrize("op", OPS)
def test_scalar_and_vector_pipes_are_synchronised(op):
    text = kernel(op)
    local = set(re.findall(r"LocalTensor<[^>]+>\s+(\w+)\s*=", text))
    for name, body in functions(text):
        vector_pending = scalar_pending = False
        for ev in pipe_events(body, local):
            if ev == "vec":
                assert not scalar_pending, f"{name}: vector op after a scalar UB write without an S->V wait"
                vector_pending = True
            elif ev == "read":
                assert not vector_pending, f"{name}: scalar UB read after a vector op without a V->S wait"
            elif ev == "write":
                assert not vector_pending, f"{name}: scalar UB write after a vector op without a V->S wait"
                scalar_pending = True
            elif ev == "vs":
                vector_pending = False
            elif ev == "sv":
                scalar_pending = False
            elif ev == "all":
                vector_pending = scalar_pending = False


@pytest.mark.parametrize("op", OPS)
def test_to_float_only_on_bfloat16(op):
    lines = kernel(op).splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\bToFloat\(", line):
            guard = "\n".join(lines[max(0, i - 3):i])
            assert re.search(r"IsSameType<\s*\w+\s*,\s*bfloat16_t\s*>", guard), \
                f"line {i + 1}: ToFloat outside an `if constexpr (IsSameType<T, bfloat16_t>::value)` branch"


@pytest.mark.parametrize("op", OPS)
def test_host_includes_exist_and_cover_the_symbols_used(op):
    own = {p.name for p in (PKG / op / "op_host").iterdir()}
    problems = []
    for src in sources(op, "op_host"):
        text = src.read_text()
        includes = re.findall(r'#include\s*[<"]([^>"]+)[>"]', text)
        problems += [f"{src.name} includes {inc}: not this project's, the C++ library's, or a CANN header known to "
                     "exist (add it to CANN_HEADERS with the release and document that ship it)"
                     for inc in includes if not (inc in own or inc in STD_HEADERS or inc in CANN_HEADERS)]
        code = strip_comments(text)
        for header, symbols in CANN_HEADERS.items():
            used = [s for s in symbols if re.search(rf"(?<![\w:]){re.escape(s)}", code)]
            if used and src.suffix == ".cpp" and not _included_transitively(src, header):
                problems.append(f"{src.name} uses {used} without including {header}")
    assert not problems, "\n".join(problems)


def _included_transitively(src, header):
    seen, todo = set(), [src]
    while todo:
        f = todo.pop()
        if f in seen or not f.exists():
            continue
        seen.add(f)
        for inc in re.findall(r'#include\s*"([^"]+)"', f.read_text()):
            if inc == header:
                return True
            todo.append(f.parent / inc)
    return False


def test_no_host_code_is_built_as_cxx11():
    # the build configuration this project carries; build_for_bazel.sh rewrites msopgen's template to C++17
    # (test_build_for_bazel.py checks that)
    configs = [p for p in PKG.rglob("*") if p.is_file() and (p.suffix in {".cmake", ".json", ".bzl"}
                                                             or p.name in {"CMakeLists.txt", "BUILD"})]
    offenders = [str(p.relative_to(ROOT)) for p in configs if re.search(r"-std=(c|gnu)\+\+11", p.read_text())]
    assert not offenders, f"-std=c++11 for host code (CANN's opbase headers need C++17): {offenders}"


def _opdef(op):
    text = strip_comments((PKG / op / "op_host" / f"{op}.cpp").read_text())
    ins = re.findall(r'Input\("(\w+)"\)\s*\.ParamType\((\w+)\)', text)
    outs = re.findall(r'Output\("(\w+)"\)\s*\.ParamType\((\w+)\)', text)
    op_type = re.search(r"class\s+(\w+)\s*:\s*public\s+OpDef", text).group(1)
    return op_type, ins, outs


@pytest.mark.parametrize("op", OPS)
def test_description_opdef_kernel_and_bridge_agree(op):
    op_type, ins, outs = _opdef(op)
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", op_type).lower()
    assert snake == op, "CANN names the kernel entry and files after the op type in snake case"
    (desc,) = json.loads((PKG / op / f"{op}.json").read_text())
    assert desc["op"] == op_type
    assert [(d["name"], d["param_type"].upper()) for d in desc["input_desc"]] == ins
    assert [(d["name"], d["param_type"].upper()) for d in desc["output_desc"]] == outs
    entry = re.search(rf'extern\s+"C"\s+__global__\s+__aicore__\s+void\s+{op}\s*\(([^)]*)\)', kernel(op))
    assert entry, f"kernel entry {op}(...) missing"
    params = [p.split()[-1] for p in entry.group(1).split(",")]
    assert params == [n for n, _ in ins] + [n for n, _ in outs] + ["workspace", "tiling"]
    for src in BRIDGE.glob("*.cc"):
        for call in re.findall(rf"EXEC_NPU_CMD\(\s*aclnn{op_type}\s*,([^;]*)\);", src.read_text()):
            assert len(call.split(",")) == len(ins) + len(outs), \
                f"{src.name}: aclnn{op_type} takes {len(ins)} inputs and {len(outs)} output(s), in OpDef order"


def _cann_include():
    inc = os.environ.get("CANN_INCLUDE")
    if not inc and os.environ.get("ASCEND_TOOLKIT_PATH"):
        inc = os.path.join(os.environ["ASCEND_TOOLKIT_PATH"], "include")
    return inc if inc and os.path.isdir(inc) else None


@pytest.mark.parametrize("op", OPS)
def test_host_code_compiles_against_cann_headers(op):
    inc = _cann_include()
    if inc is None:
        pytest.skip("CANN's headers are not here (set CANN_INCLUDE or ASCEND_TOOLKIT_PATH to run this check); "
                    "they are licensed for Huawei processors only and are not vendored")
    if shutil.which("g++") is None:
        pytest.skip("g++ missing")
    for src in sources(op, "op_host", exts=(".cpp",)):
        res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{PKG / op / 'op_host'}", f"-I{inc}",
                              f"-I{inc}/experiment", f"-I{inc}/experiment/platform", str(src)],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
