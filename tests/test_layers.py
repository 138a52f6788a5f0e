"""The core's one-way layers (docs/architecture.md, "Layers").

Every module of ``pai_zoo/`` is read with :mod:`ast`; imports inside functions count, ``if TYPE_CHECKING:`` blocks
do not. A module may import only from its own layer or below, and pai-zoo's modules must not import each other in a
cycle (neither across layers nor within one).

An import inside a function is allowed only where it keeps a slow package (``HEAVY``: torch, megatron-core,
transformers ...) out of the importing module: the imported module brings one in at its top level that the importer
does not already have. Anything else goes at the top of the module. Two exceptions: imports inside ``try:`` (probing
an optional package or a megatron-core version), and ``pai_zoo/__init__.py``, which every submodule import runs and
which therefore re-exports the API (``load``, ``convert``, ``generate``) lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

PACKAGE = Path(__file__).resolve().parents[1] / "pai_zoo"
#: The conformance suite: its checks sit above the workflows they exercise (and below ``plugin new``, which measures
#: a draft plugin with them); its command runners run the CLI, so they sit above it.
CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance" / "pai_zoo_conformance"
ROOTS = {"pai_zoo": PACKAGE, "pai_zoo_conformance": CONFORMANCE}
CONFORMANCE_CHECKS_LAYER, CONFORMANCE_RUNNERS_LAYER = 9, 12
#: The suite's pytest plugin (it starts the command server and the workers) and its command runners.
CONFORMANCE_RUNNERS = ("pai_zoo_conformance.plugin", "pai_zoo_conformance.cli_runs", "pai_zoo_conformance.cli_server")

# Layers, bottom (0) to top (12): each is a package of pai_zoo/ (docs/architecture.md, "Layers"). A module's layer is
# that of the longest name here that it equals or lies under. lora.settings (what a LoRA run and a PEFT folder agree
# on) is plain data, below the formats that read it.
LAYERS = {
    0: ("plugin", "lora.settings"),
    1: ("tables", "util"),
    2: ("families",),
    3: ("formats", "tokenizers", "hf"),
    4: ("mcore",),
    5: ("lora", "testing"),
    6: ("models",),
    7: ("conversion",),
    8: ("data", "generation", "training", "rl", "evaluation"),
    # 9: the conformance suite's checks (pai_zoo_conformance)
    10: ("scaffold",),
    11: ("cli",),
    # 12: the conformance suite's command runners (pai_zoo_conformance.cli_runs, .cli_server)
}
PACKAGE_LAYER = 11  # ``pai_zoo/__init__.py`` re-exports the API (``load``, ``convert``) on top of everything
LAYER_NAMES = {
    0: "L0 plugin API",
    1: "L1 weight tables & utilities",
    2: "L2 families & registry",
    3: "L3 formats, tokenizers, transformers",
    4: "L4 megatron-core",
    5: "L5 LoRA & test helpers",
    6: "L6 models",
    7: "L7 conversion",
    8: "L8 workflows",
    9: "L9 conformance checks",
    10: "L10 plugin scaffold",
    11: "L11 cli",
    12: "L12 conformance command runners",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in [*PACKAGE.rglob("*.py"), *CONFORMANCE.rglob("*.py")]:
        root = PACKAGE if path.is_relative_to(PACKAGE) else CONFORMANCE
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def layer_of(module: str) -> int:
    """The layer of ``module`` (``pai_zoo.x.y``); fails on a module the table does not place."""
    if module == "pai_zoo":
        return PACKAGE_LAYER
    if module.split(".")[0] == "pai_zoo_conformance":
        return CONFORMANCE_RUNNERS_LAYER if module.startswith(CONFORMANCE_RUNNERS) else CONFORMANCE_CHECKS_LAYER
    rest = module.split(".")[1:]
    for n in range(len(rest), 0, -1):
        prefix = ".".join(rest[:n])
        for layer, names in LAYERS.items():
            if prefix in names:
                return layer
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


# Third-party packages slow enough to keep out of ``import pai_zoo`` and ``pai-zoo list``.
HEAVY = frozenset({
    "torch", "megatron", "transformers", "numpy", "safetensors", "tokenizers", "tiktoken", "sentencepiece",
    "gigatoken", "google", "yaml", "psutil", "lm_eval", "datasets",
})


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        if not is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    return [f"{base}.{a.name}" for a in node.names]  # a name that is no module resolves to ``base`` below


def import_graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported pai_zoo module: line}}``, counting function-level imports, not TYPE_CHECKING ones."""
    graph = {}
    for name, path in mods.items():
        deps: dict[str, int] = {}
        is_package = path.name == "__init__.py"

        class Visitor(ast.NodeVisitor):
            def visit_If(self, node):
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    for child in node.orelse:
                        self.visit(child)
                    return
                self.generic_visit(node)

            def _import(self, node):
                for target in _targets(name, node, is_package):
                    if target.split(".")[0] not in ROOTS:
                        continue
                    while target and target not in mods:  # ``from pai_zoo.x import name``: the module pai_zoo.x
                        target = target.rpartition(".")[0]
                    if target and target != name:
                        deps.setdefault(target, node.lineno)

            visit_Import = visit_ImportFrom = _import

        Visitor().visit(ast.parse(path.read_text(), str(path)))
        graph[name] = deps
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _shown(path: Path) -> str:
    for root in ROOTS.values():
        if path.is_relative_to(root.parent):
            return str(path.relative_to(root.parent))
    return str(path)


def upward_imports(graph: dict[str, dict[str, int]], mods: dict[str, Path]) -> list[str]:
    out = []
    for importer, deps in sorted(graph.items()):
        for imported, line in sorted(deps.items()):
            if layer_of(imported) > layer_of(importer):
                where = f"{_shown(mods[importer])}:{line}"
                out.append(
                    f"{importer} ({LAYER_NAMES[layer_of(importer)]}) -> {imported} "
                    f"({LAYER_NAMES[layer_of(imported)]}) at {where}"
                )
    return out


def _resolve(target: str, mods) -> str:
    """The pai_zoo module ``target`` names (``from pai_zoo.x import name``: pai_zoo.x), or its top-level package."""
    if target.split(".")[0] not in ROOTS:
        return target.split(".")[0]
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target


def scan_imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str, bool]]]]:
    """``(top, inner)``: each module's top-level imports (pai_zoo modules and third-party top-level packages), and
    its imports inside functions as ``(line, imported, inside try:)``; ``TYPE_CHECKING`` blocks are skipped."""
    top: dict[str, set[str]] = {}
    inner: dict[str, list[tuple[int, str, bool]]] = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        top[name], inner[name] = set(), []

        def walk(node, in_function: bool, in_try: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    for other in child.orelse:
                        walk(ast.Module(body=[other], type_ignores=[]), in_function, in_try)
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(name, child, is_package):
                        imported = _resolve(target, mods)
                        if imported == name:
                            continue
                        if in_function:
                            inner[name].append((child.lineno, imported, in_try))
                        else:
                            top[name].add(imported)
                    continue
                walk(
                    child,
                    in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                    in_try or (in_function and isinstance(child, ast.Try)),
                )

        walk(ast.parse(path.read_text(), str(path)), False, False)
    return top, inner


def heavy_at_import(top: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """The ``HEAVY`` packages that importing each module brings in (its top-level closure, parent packages too)."""
    memo: dict[str, frozenset[str]] = {}

    def visit(module: str, seen: frozenset[str]) -> frozenset[str]:
        if module not in top:
            return frozenset({module}) & HEAVY
        if module in memo:
            return memo[module]
        parts = module.split(".")
        deps = set(top[module]) | {".".join(parts[:i]) for i in range(1, len(parts))}
        out = frozenset().union(*(visit(d, seen | {module}) for d in deps if d not in seen | {module}))
        memo[module] = out
        return out

    return {module: visit(module, frozenset()) for module in top}


def needless_function_level_imports(mods: dict[str, Path]) -> list[str]:
    """Imports inside functions that keep no ``HEAVY`` package out of their module (see the module docstring)."""
    top, inner = scan_imports(mods)
    heavy = heavy_at_import(top)
    out = []
    for importer, imports in sorted(inner.items()):
        if importer == "pai_zoo" or importer.split(".")[0] != "pai_zoo":
            continue
        for line, imported, in_try in imports:
            if in_try:
                continue
            brings = heavy[imported] if imported in mods else frozenset({imported}) & HEAVY
            if imported not in mods and not brings:
                continue  # a light third-party module (json, shutil ...): where it is imported is style
            if not brings - heavy[importer]:
                path = mods[importer]
                where = f"{path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path}:{line}"
                out.append(
                    f"{where}: {importer} imports {imported} inside a function, but it keeps nothing heavy out "
                    f"({imported} brings {', '.join(sorted(brings)) or 'nothing heavy'}): import it at the top"
                )
    return out


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return mods, import_graph(mods)


def test_every_module_has_a_layer(graph):
    mods, _ = graph
    for name in mods:
        layer_of(name)


def test_no_import_cycle(graph):
    _, g = graph
    found = cycles(g)
    assert not found, "import cycles among pai_zoo's modules:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_no_import_from_a_higher_layer(graph):
    mods, g = graph
    found = upward_imports(g, mods)
    assert not found, "imports from a higher layer (importer -> imported):\n" + "\n".join("  " + f for f in found)


def test_function_level_imports_only_keep_heavy_packages_out():
    found = needless_function_level_imports(_modules())
    assert not found, "function-level imports that keep nothing heavy out:\n" + "\n".join("  " + f for f in found)


def test_import_pai_zoo_and_pai_zoo_list_stay_light():
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "import pai_zoo\n"
        "from pai_zoo.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['list'])\n"
        f"print(sorted(m for m in {sorted(HEAVY - {'google', 'yaml', 'psutil'})!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# -- the checker itself can fail ---------------------------------------------------------------------------------
def test_checker_finds_a_cycle_and_an_upward_import():
    graph = {
        "pai_zoo.families.registry": {"pai_zoo.plugin.errors": 1},
        "pai_zoo.plugin.errors": {"pai_zoo.rl.ppo": 2},
        "pai_zoo.rl.ppo": {"pai_zoo.families.registry": 3},
        "pai_zoo.tables.mapping": {},
    }
    assert cycles(graph) == [["pai_zoo.families.registry", "pai_zoo.plugin.errors", "pai_zoo.rl.ppo"]]
    mods = {name: PACKAGE / "x.py" for name in graph}
    assert upward_imports(graph, mods) == [
        "pai_zoo.plugin.errors (L0 plugin API) -> pai_zoo.rl.ppo (L8 workflows) at pai_zoo/x.py:2"
    ]


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path):
    pkg = tmp_path / "pai_zoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .handle import x\n"
        "def f():\n    from . import cli\n"
    )
    (pkg / "handle.py").write_text("")
    (pkg / "cli.py").write_text("")
    mods = {
        "pai_zoo": pkg / "__init__.py",
        "pai_zoo.errors": pkg / "errors.py",
        "pai_zoo.handle": pkg / "handle.py",
        "pai_zoo.cli": pkg / "cli.py",
    }
    assert import_graph(mods)["pai_zoo.errors"] == {"pai_zoo.cli": 5}


def test_checker_finds_a_needless_function_level_import(tmp_path):
    pkg = tmp_path / "pai_zoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "light.py").write_text("import json\n")
    (pkg / "heavy.py").write_text("import torch\n")
    (pkg / "user.py").write_text(
        "def f():\n    from . import light\n"          # needless: light brings nothing heavy
        "def g():\n    from . import heavy\n"          # kept: it keeps torch out of user
        "def h():\n    try:\n        from . import light\n    except ImportError:\n        pass\n"  # a probe
    )
    (pkg / "torchy.py").write_text("import torch\ndef f():\n    from . import heavy\n")  # torch is here already
    names = ("light", "heavy", "user", "torchy")
    mods = {"pai_zoo": pkg / "__init__.py", **{f"pai_zoo.{n}": pkg / f"{n}.py" for n in names}}
    found = [line.split(": ")[0].rsplit("/", 1)[-1] for line in needless_function_level_imports(mods)]
    assert found == ["torchy.py:3", "user.py:2"]
