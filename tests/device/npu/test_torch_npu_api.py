"""The torch_npu API as the real wheel declares it, against the emulator and the engine's calls.

scripts/setup.sh unpacks the pinned torch-npu wheel (requirements-torch-npu.txt) into .deps/: its operator
schemas (csrc/aten/*.yaml, the source of torch_npu's Python bindings), op-plugin's ATB interface header and
the torch_npu.npu module. The emulator must take exactly those signatures (a keyword the real op lacks is a
TypeError on a real NPU), and every call the NPU backend makes must bind to them."""

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.npu_emulator.install import install

ROOT = Path(__file__).resolve().parents[3]
PIN = (ROOT / "requirements-torch-npu.txt").read_text().split("torch-npu==")[1].split()[0]
WHEEL = ROOT / ".deps" / f"torch_npu-{PIN}" / "torch_npu"
NPU_SRC = ROOT / "rtp_llm" / "device" / "npu"

torch_npu = install()


def _wheel(rel: str) -> Path:
    p = WHEEL / rel
    assert p.exists(), f"{p} missing: scripts/setup.sh unpacks torch-npu=={PIN} into .deps/"
    return p


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([" and 1 or ch in ")]" and -1 or 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _default(text: str):
    """A schema default as Python sees it; enum-like defaults (at::Reduction::Mean) stay as their text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class Param:
    def __init__(self, name, kw_only, has_default, default):
        self.name, self.kw_only, self.has_default, self.default = name, kw_only, has_default, default

    def __repr__(self):
        return f"{'*' if self.kw_only else ''}{self.name}{'=' + repr(self.default) if self.has_default else ''}"

    def key(self):
        return (self.name, self.kw_only, self.has_default, self.default)


def _schema_params(args: str) -> list[Param]:
    params, kw_only = [], False
    for a in _split_args(args):
        if a == "*":
            kw_only = True
            continue
        decl, _, dflt = a.partition("=")
        name = decl.split()[-1]
        params.append(Param(name, kw_only, bool(dflt), _default(dflt.strip()) if dflt else None))
    return params


def load_schemas() -> dict[str, list[Param]]:
    schemas: dict[str, list[Param]] = {}
    for yaml in sorted(_wheel("csrc/aten").glob("*.yaml")):
        for m in re.finditer(r"func:\s*([A-Za-z_0-9]+)\((.*)\)\s*->", yaml.read_text()):
            params = _schema_params(m.group(2))
            prev = schemas.setdefault(m.group(1), params)
            assert [p.key() for p in prev] == [p.key() for p in params], f"{m.group(1)}: two differing schemas"
    # ATB operators are declared in C++ only (no yaml); their Python names are the C++ parameter names.
    atb = _wheel("include/third_party/op-plugin/op_plugin/include/AtbOpsInterface.h").read_text()
    for m in re.finditer(r"TORCH_NPU_API\s+[\w:<>,\s]+?\s(_npu_\w+)\(([^)]*)\);", atb):
        schemas.setdefault(m.group(1), [Param(re.split(r"[\s&*]+", a.strip())[-1], False, False, None)
                                        for a in m.group(2).split(",")])
    return schemas


SCHEMAS = load_schemas()
EMULATED_OPS = sorted(n for n in vars(torch_npu) if n.startswith(("npu_", "_npu_")) and callable(getattr(torch_npu, n)))


def test_schemas_parsed():
    # The parser read the ops the backend needs, with their real keyword names (a broken parser fails here,
    # not as a vacuous pass below).
    assert [p.name for p in SCHEMAS["npu_top_k_top_p"]] == ["logits", "p", "k"]
    assert "compress_seq_offsets" in [p.name for p in SCHEMAS["npu_scatter_pa_kv_cache"]]
    assert [p.name for p in SCHEMAS["_npu_reshape_and_cache"]][-1] == "slot_indices"
    assert len(EMULATED_OPS) >= 8


@pytest.mark.parametrize("op", EMULATED_OPS)
def test_emulator_signature_is_the_wheels(op):
    assert op in SCHEMAS, f"torch_npu {PIN} has no operator {op}"
    if getattr(getattr(torch_npu, op), "not_emulated", False):
        return  # a stub that only raises
    sig = inspect.signature(getattr(torch_npu, op))
    assert not [p for p in sig.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], \
        f"{op}: *args/**kwargs would accept keywords the real op refuses"
    got = [Param(p.name, p.kind == p.KEYWORD_ONLY, p.default is not p.empty,
                 None if p.default is p.empty else p.default) for p in sig.parameters.values()]
    want = SCHEMAS[op]
    assert [p.key() for p in got] == [p.key() for p in want], f"{op}: emulator {got} != torch_npu {PIN} {want}"


def _npu_calls():
    """(file:line, op, n_positional, keywords) of each torch_npu.<op>(...) / self.torch_npu.<op>(...) call."""
    for path in sorted(NPU_SRC.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id == "torch_npu") or \
                    (isinstance(owner, ast.Attribute) and owner.attr == "torch_npu"):
                yield f"{path.name}:{node.lineno}", node.func.attr, len(node.args), [k.arg for k in node.keywords]


CALLS = list(_npu_calls())


def test_backend_calls_found():
    assert {op for _, op, _, _ in CALLS} >= {"npu_fused_infer_attention_score", "npu_top_k_top_p",
                                              "npu_scatter_pa_kv_cache", "_npu_reshape_and_cache"}


@pytest.mark.parametrize("where,op,n_pos,keywords", CALLS, ids=[f"{c[0]}:{c[1]}" for c in CALLS])
def test_backend_call_binds_to_the_schema(where, op, n_pos, keywords):
    assert op in SCHEMAS, f"{where}: torch_npu {PIN} has no operator {op}"
    params = SCHEMAS[op]
    positional = [p for p in params if not p.kw_only]
    assert n_pos <= len(positional), f"{where}: {op} takes {len(positional)} positional arguments, given {n_pos}"
    names = {p.name for p in params}
    unknown = [k for k in keywords if k not in names]
    assert not unknown, f"{where}: {op} has no keyword {unknown} (torch_npu {PIN}: {params})"
    bound = {p.name for p in positional[:n_pos]} | set(keywords)
    missing = [p.name for p in params if not p.has_default and p.name not in bound]
    assert not missing, f"{where}: {op} call leaves {missing} unset"


def _real_npu_module_all() -> set[str]:
    tree = ast.parse(_wheel("npu/__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("torch_npu/npu/__init__.py has no __all__")


def _engine_torch_npu_uses():
    for path in sorted((ROOT / "rtp_llm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "npu" and getattr(node.value.value, "id", None) == "torch":
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node.attr


def test_torch_npu_module_api_exists():
    real = _real_npu_module_all()
    uses = list(_engine_torch_npu_uses())
    assert {a for _, a in uses} >= {"set_device", "synchronize"}
    missing = [f"{w} torch.npu.{a}" for w, a in uses if a not in real]
    assert not missing, f"not in torch_npu {PIN}'s torch.npu: {missing}"
    # The emulator offers nothing the real module lacks (tests could otherwise lean on it).
    import torch
    extra = [a for a in vars(torch.npu) if not a.startswith("__") and a not in real and not a.startswith("_is_in")]
    assert not extra, f"emulated torch.npu has {extra}, which torch_npu {PIN} does not export"


def test_the_pinned_wheel_is_the_release_the_npu_path_names():
    """One place names the Ascend software the checks ran against (rtp_llm/device/npu/versions.py): the wheel these
    checks read is that torch_npu, built against the torch this project pins."""
    from rtp_llm.device.npu import versions

    assert PIN == versions.TORCH_NPU
    assert (WHEEL / "version.py").read_text().split("__version__ = ")[1].split()[0].strip("'\"") == versions.TORCH_NPU
    torch_pin = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert torch_pin == [f"torch=={versions.TORCH}"]
