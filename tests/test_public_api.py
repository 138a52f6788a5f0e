"""The public API is what docs/writing-a-plugin.md uses (issue 18): every pai-zoo name the guide mentions, in a
code block or in backticks, imports, and is listed in the ``__all__`` of ``pai_zoo`` or of the submodule the guide
names for it. A name added to the guide without an export, or an export renamed under the guide, fails here."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"

#: Capitalised names in the guide's backticks that are not pai-zoo's: other libraries', Python's, an
#: environment variable, a placeholder for any norm class, the example architecture.
NOT_PAI_ZOO = {
    "AutoTokenizer", "CONFIG_MAPPING", "FileNotFoundError", "GPTModel", "ModuleSpec", "None", "Norm",
    "PAI_ZOO_PLUGINS", "Phi3ForCausalLM", "TransformerBlockSubmodules", "TransformerConfig", "GemmaForCausalLM",
    "LanguageModelEmbedding", "True", "False",
}
#: ``pai_zoo.x`` strings in the guide that are file names, not modules.
NOT_NAMES = {"pai_zoo.json"}


def _doc():
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    prose = re.sub(r"```\w*\n.*?```", "", text, flags=re.S)
    ticks = [t.replace("\\|", "|") for t in re.findall(r"`([^`\n]+)`", prose)]
    return blocks, ticks


def _python_blocks():
    return [ast.parse(code) for lang, code in _doc()[0] if lang == "python"]


def imports() -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from pai_zoo... import name`` in the guide's code and backticks."""
    found = []
    for tree in _python_blocks():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "pai_zoo", "pai_zoo_conformance") and not node.level:
                found += [(node.module, a.name) for a in node.names]
    for tick in _doc()[1]:
        for module, names in re.findall(r"from (pai_zoo[\w.]*) import ([\w, ]+)", tick):
            found += [(module, n.strip()) for n in names.split(",") if n.strip()]
    return sorted(set(found))


def dotted() -> list[str]:
    """Every dotted ``pai_zoo.x.y`` / ``pai_zoo_conformance.x`` name in the guide (not inside quotes: a quoted
    ``"pai_zoo.rope_scaling"`` is a config key)."""
    blocks, ticks = _doc()
    text = "\n".join([code for _, code in blocks] + ticks)
    names = re.findall(r"(?<![\"'\w.])(pai_zoo(?:_conformance)?(?:\.\w+)+)", text)
    return sorted(set(names) - NOT_NAMES)


def defined_by_the_doc() -> set[str]:
    """Names the guide's own example code defines (classes, functions, module-level assignments)."""
    names = set()
    for tree in _python_blocks():
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def bare() -> list[str]:
    """Capitalised names in backticks, ``Name``, ``Name(...)`` or ``Name.attr``: pai-zoo's unless listed in
    :data:`NOT_PAI_ZOO` or defined by the guide's example code."""
    found = {m for t in _doc()[1] for m in re.findall(r"^([A-Z]\w*)(?:\(|\.|$)", t)}
    return sorted(found - NOT_PAI_ZOO - (defined_by_the_doc() - {"FusedQKV"}))


def _resolve(name: str):
    """Import the longest module prefix of ``name``, then the attributes; returns (module, attribute name)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        obj = module
        for attr in parts[n:]:
            assert hasattr(obj, attr), f"the guide names {name}, but {'.'.join(parts[:n])} has no {attr!r}"
            obj = getattr(obj, attr)
        return module, (parts[n] if n < len(parts) else None)
    raise AssertionError(f"the guide names {name}, which does not import")


def _exported(module, attr: str) -> bool:
    return attr in getattr(module, "__all__", [attr])  # a module without __all__ exports every public name


def test_the_guide_mentions_what_this_test_reads():
    """The collectors find the guide's names (so an empty match cannot pass the other tests)."""
    assert ("pai_zoo", "WeightMap") in imports() and ("pai_zoo.config_map", "sliding_window") in imports()
    assert "pai_zoo.mcore.specs.submodules_of" in dotted() and "pai_zoo.config_map.Rule" in dotted()
    assert {"FixedIfPresent", "LazyClass", "Row", "MappingContext"} <= set(bare())
    assert "OffsetRMSNorm" in defined_by_the_doc()


@pytest.mark.megatron
@pytest.mark.parametrize("module,name", imports())
def test_every_import_in_the_guide_works_and_is_exported(module, name):
    mod = importlib.import_module(module)
    try:  # a submodule (`from pai_zoo import hf`), whether or not an earlier import made it an attribute
        submodule = importlib.util.find_spec(f"{module}.{name}") is not None
    except ModuleNotFoundError:  # ``module`` is no package
        submodule = False
    if submodule:
        importlib.import_module(f"{module}.{name}")
        return
    if not hasattr(mod, name):
        pytest.fail(f"the guide has `from {module} import {name}`, which fails")
    assert _exported(mod, name), f"{module}.{name} is used by the guide but not in {module}.__all__"


@pytest.mark.megatron
@pytest.mark.parametrize("name", dotted())
def test_every_dotted_name_in_the_guide_resolves(name):
    module, attr = _resolve(name)
    if attr is not None:
        assert _exported(module, attr), f"the guide names {name}, which is not in {module.__name__}.__all__"


@pytest.mark.megatron
@pytest.mark.parametrize("name", bare())
def test_every_bare_name_in_the_guide_is_exported(name):
    """A bare ``Name`` is in ``pai_zoo.__all__``, or in the ``__all__`` of a pai-zoo module the guide names
    (``pai_zoo.testing.tokenizers``' ``ByteLevelBPE``); ``Name.attr`` has that attribute (or dataclass field)."""
    import pai_zoo

    head, _, attr = name.partition(".")
    modules = [pai_zoo] + [importlib.import_module(m) for m in {m for m, _ in imports()}]
    modules += [_resolve(name_)[0] for name_ in dotted()]
    owners = [m for m in modules if head in getattr(m, "__all__", ())]
    assert owners, f"the guide names `{head}`, which no __all__ of pai_zoo or of a module the guide names lists"
    if attr:
        obj = getattr(owners[0], head)
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        assert hasattr(obj, attr) or attr in fields, f"the guide names {name}, but {head} has no {attr!r}"
