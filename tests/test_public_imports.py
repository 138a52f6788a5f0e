"""The import paths that third-party plugins and docs/ use keep working (issue 42): the package is laid out by layer
(pai_zoo/plugin, tables, families, formats, ... : docs/architecture.md), and each module that moved keeps its old
path as an alias of the same module object. A path listed here that disappears, or resolves to another module, fails.

Every ``from pai_zoo... import`` and ``import pai_zoo...`` in a code block of docs/ is checked too, so a doc that
shows an import nobody keeps fails here, not in a reader's hands."""
from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.megatron_once  # imports megatron-core (pai_zoo.mcore.build ...); no version of it matters

ROOT = Path(__file__).resolve().parents[1]

#: Old or public path -> the module it is now. The first group are the names the plugin API promises.
PUBLIC_MODULES = {
    "pai_zoo.config_map": "pai_zoo.plugin.config_map",
    "pai_zoo.mapping": "pai_zoo.tables.mapping",
    "pai_zoo.layouts": "pai_zoo.tables.layouts",
    "pai_zoo.family": "pai_zoo.families.family",
    "pai_zoo.errors": "pai_zoo.plugin.errors",
    "pai_zoo.hookspecs": "pai_zoo.plugin.hookspecs",
    "pai_zoo.registry": "pai_zoo.families.registry",
    "pai_zoo.weights": "pai_zoo.models.state_dicts",
    "pai_zoo.testing.tokenizers": "pai_zoo.testing.tokenizers",
    "pai_zoo.mcore.specs": "pai_zoo.mcore.specs",
    "pai_zoo.mcore.build": "pai_zoo.mcore.build",
    "pai_zoo.rl": "pai_zoo.rl",
    "pai_zoo.rl.reward_funcs": "pai_zoo.rl.reward_funcs",
    "pai_zoo.rl.policy": "pai_zoo.rl.policy",
    "pai_zoo.rl.checkpoint": "pai_zoo.rl.checkpoint",
    # the other modules that moved out of the flat top level
    "pai_zoo.hf": "pai_zoo.hf",
    "pai_zoo.hf_reference": "pai_zoo.hf.reference",
    "pai_zoo.vision": "pai_zoo.plugin.vision",
    "pai_zoo.quantization": "pai_zoo.plugin.quantization",
    "pai_zoo.megatron_args": "pai_zoo.plugin.megatron_args",
    "pai_zoo.defaults": "pai_zoo.families.defaults",
    "pai_zoo.expert_names": "pai_zoo.tables.expert_names",
    "pai_zoo.background": "pai_zoo.util.background",
    "pai_zoo.checkpoint": "pai_zoo.formats.hf_folder",
    "pai_zoo.fp8_blocks": "pai_zoo.formats.encodings.fp8_blocks",
    "pai_zoo.megatron_lm": "pai_zoo.models.megatron_checkpoint",
    "pai_zoo.handle": "pai_zoo.models.handle",
    "pai_zoo.inspection": "pai_zoo.models.inspection",
    "pai_zoo.verification": "pai_zoo.models.verification",
    "pai_zoo.convert_settings": "pai_zoo.conversion.settings",
    "pai_zoo.run_checkpoint": "pai_zoo.training.run_checkpoint",
    "pai_zoo.conformance_record": "pai_zoo.testing.conformance_record",
    "pai_zoo.demo": "pai_zoo.cli.demo",
}

#: The names ``pai_zoo`` itself exports (its ``__all__``), which plugins import from the top level.
TOP_LEVEL = ("ConfigMap", "ConfigTranslationError", "Copy", "Dropped", "Family", "Field", "Fixed", "FixedIfPresent",
             "FusedQKV", "GateUp", "LazyClass", "MappingContext", "MappingError", "McoreConfig", "Output",
             "PaiZooError", "PluginError", "QKV", "Require", "Rope", "Row", "Rule", "UnknownModelError", "Vocab",
             "WeightMap", "convert", "export_hf_weights", "generate", "get_registry", "hookimpl", "import_hf_weights",
             "load")


@pytest.mark.parametrize("old,new", sorted(PUBLIC_MODULES.items()))
def test_public_module_path_imports_the_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert importlib.import_module(new).__name__ == new  # the module keeps its own name


def test_an_old_path_keeps_its_module_spec():
    """Importing by the old path does not rename the module (pickles, reloads and tracebacks name the real one)."""
    code = ("import pai_zoo.handle as old, pai_zoo.models.handle as new; "
            "print(old is new, new.__spec__.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "pai_zoo.models.handle"]


def test_top_level_names():
    import pai_zoo

    assert sorted(TOP_LEVEL) == sorted(pai_zoo.__all__)
    for name in TOP_LEVEL:
        assert getattr(pai_zoo, name) is not None


def test_from_imports_of_the_old_paths():
    import pai_zoo
    from pai_zoo.config_map import sliding_window
    from pai_zoo.family import Family
    from pai_zoo.hf_reference import RMSNorm  # a remote-code plugin's reference model piece
    from pai_zoo.mapping import QKV, WeightMap
    from pai_zoo.vision import VisionSpec
    from pai_zoo.weights import mcore_tensors

    assert (Family, WeightMap, QKV, VisionSpec) == (pai_zoo.Family, pai_zoo.WeightMap, pai_zoo.QKV,
                                                     pai_zoo.plugin.vision.VisionSpec)
    assert callable(sliding_window) and callable(mcore_tensors) and RMSNorm.__module__ == "pai_zoo.hf.reference"


def test_the_former_conversion_module_names():
    """``pai_zoo.conversion`` was a module; as a package it still gives its names (``convert`` the function, not a
    submodule, even once every conversion module is imported)."""
    import pai_zoo.conversion.entry
    import pai_zoo.conversion.to_hf  # noqa: F401
    from pai_zoo.conversion import ConversionReport, convert, verify_conversion

    assert convert is pai_zoo.conversion.entry.convert and callable(verify_conversion)
    assert ConversionReport.__module__ == "pai_zoo.conversion.report"
    with pytest.raises(AttributeError):
        pai_zoo.conversion.no_such_name  # noqa: B018


def test_an_unknown_path_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pai_zoo.no_such_module")


def _doc_imports() -> list[tuple[str, str]]:
    """``(doc file, import statement)`` of every pai-zoo import in a Python code block of README.md and docs/."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for code in re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    text = ast.unparse(node)
                    if re.match(r"(from|import) pai_zoo\b", text):
                        found.append((doc.name, text))
    return sorted(set(found))


def test_the_docs_show_imports():
    assert len(_doc_imports()) >= 10  # the guide's plugin and its debugging snippet, the tutorials


@pytest.mark.parametrize("doc,statement", _doc_imports())
def test_every_import_a_doc_shows_works(doc, statement):
    exec(compile(statement, f"{doc} (code block)", "exec"), {})
