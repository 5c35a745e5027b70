"""The house rules, checked on the source: no import cycle between rtp_llm's modules, imports only down the floors,
models/ never reaching into sampling/ or engine/, no device-name branch outside device/, Python files small enough
to read, and a repository that stands alone (no path into a sibling checkout)."""

from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "rtp_llm")
# Top floor first; a module imports from its own floor or below.
FLOORS = ["server start_server llm tools doctor", "engine", "spec_decode lora", "distributed", "tokenizer", "models",
          "sampling pooling", "layers", "device", "cache", "_native", "config errors __init__"]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms.split()}
MAX_LINES = 420


def _modules() -> dict[str, str]:
    mods = {}
    for dirpath, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d not in ("cpp", "__pycache__")]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    """module -> the rtp_llm modules it imports (anywhere in its body, type-checking blocks included). The package
    itself (rtp_llm/__init__.py, the public facade) re-exports from every floor and is left out as an importer."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods}
                found.update(subs)
                if len(subs) < len(node.names):  # names from the module itself, not only its submodules
                    found.add(base)
        graph[name] = {m for m in found if m in mods and m != name and m != "rtp_llm"}
    return graph


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def graph():
    return _imports(_modules())


def test_no_import_cycles(graph):
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_only_go_down_the_floors(graph):
    up = [f"{a} -> {b}" for a, bs in graph.items() for b in bs
          if a != "rtp_llm" and _room(a) in FLOOR and _room(b) in FLOOR and FLOOR[_room(b)] < FLOOR[_room(a)]]
    unknown = sorted({_room(m) for m in graph} - set(FLOOR))
    assert not unknown, f"rooms with no floor (add them to FLOORS): {unknown}"
    assert not up, "imports up the floors:\n" + "\n".join(sorted(up))


def test_models_import_neither_sampling_nor_engine(graph):
    bad = [f"{a} -> {b}" for a, bs in graph.items() if _room(a) == "models" for b in bs
           if _room(b) in ("sampling", "engine")]
    assert not bad, "the model returns hidden states; sampling belongs to the runner:\n" + "\n".join(bad)


def test_no_device_name_branches_outside_device():
    branch = re.compile(r"""(\.name|device_type|\.type)\s*[!=]=\s*["'](cpu|cuda|npu)["']""")
    hits = [f"{path}:{n}" for name, path in _modules().items() if _room(name) != "device"
            for n, line in enumerate(open(path, encoding="utf-8"), 1) if branch.search(line)]
    assert not hits, "ask the device instead of branching on its name:\n" + "\n".join(hits)


def test_python_files_stay_small():
    big = [f"{os.path.relpath(p, ROOT)}: {n} lines" for p in _modules().values()
           if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_LINES]
    assert not big, f"split by role (at most {MAX_LINES} lines):\n" + "\n".join(big)


def test_the_repository_stands_alone():
    """Nothing tracked points into a checkout beside this one."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    needle = re.compile(r"\.\./shared|\bshared/(reference|hooks|seeds)\b|ARCHITECTURE\.md")
    hits = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path) or os.path.getsize(path) > 2_000_000:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if needle.search(line)]
    assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_comments_say_why_without_figures_or_history():
    """Measured figures live in benchmarks/ beside their command, the story in commits and issue notes."""
    figure = re.compile(r"\b(issue \d+|\d[\d.]* ?(ms|us|GB/s|GFLOP/s|tok/s)\b|\d[\d.]*x (faster|slower))")
    hits = []
    for dirpath, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            marker = "#" if f.endswith(".py") else "//" if f.endswith((".cc", ".h")) else None
            if marker is None:
                continue
            path = os.path.join(dirpath, f)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                comment = line.partition(marker)[2]
                if figure.search(comment):
                    hits.append(f"{os.path.relpath(path, ROOT)}:{n}")
    assert not hits, "comments with figures or history:\n" + "\n".join(hits)
