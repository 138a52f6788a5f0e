"""``pai-zoo plugin new``: a third-party plugin distribution generated from a Hugging Face config.

    draft = new_plugin("helium", "helium", "out/pai-zoo-helium")   # or a folder, a config.json, a class name

writes ``pyproject.toml`` (entry point group ``pai_zoo``), the package (``ConfigMap``, ``WeightMap``, ``Family``,
presets: tiny, odd and the source config), ``tests/test_conformance.py`` and a README. It infers the config rules
and the weight table (:mod:`pai_zoo.scaffold.draft`), then measures the result against transformers with the
conformance suite's own checks and tries the known variants where the logits differ
(:mod:`pai_zoo.scaffold.measure`). What stays unexplained is written as a marked stub. The generated code imports
only pai-zoo's public API.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..families.registry import get_registry
from ..util.outputs import output_folder
from .draft import Draft, infer
from .measure import search
from .render import conformance_test, package_init, presets_module, pyproject, readme
from .source import ScaffoldError, read_source

__all__ = ["Draft", "ScaffoldError", "new_plugin", "write_plugin"]

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def _check_name_form(name: str) -> None:
    if not _NAME.match(name):
        raise ScaffoldError(f"plugin name {name!r}: use lower-case letters, digits and single dashes (e.g. 'helium')")


def _check_name(name: str, architecture: str, model_type: str) -> None:
    _check_name_form(name)
    registry = get_registry()
    if registry.is_family(name) or registry.is_preset(name):
        raise ScaffoldError(f"plugin name {name!r} is already a family or preset name of an installed plugin",
                            hint="pick another NAME (`pai-zoo list` shows the installed families)")
    for family in registry.families.values():
        if architecture in family.hf_architectures or model_type in family.model_types:
            raise ScaffoldError(f"{architecture} (model_type {model_type!r}) is already claimed by family "
                                f"{family.name!r} (plugin {family.plugin!r})",
                                hint=f"`pai-zoo info {family.name}` shows it; a second family would make every "
                                     "lookup of this architecture ambiguous")


def new_plugin(name: str, source: str, output=None, like: str | None = None, force: bool = False) -> Draft:
    """Infer, measure and write the plugin ``name`` for ``source`` into ``output`` (default
    ``./pai-zoo-NAME``); returns the measured :class:`Draft` (its ``stubs`` empty when it passed)."""

    _check_name_form(name)  # before the source is read (which imports transformers)
    if like is not None and not get_registry().is_family(like):
        raise ScaffoldError(f"--like {like}: no installed family of that name (installed: "
                            f"{', '.join(sorted(get_registry().families)) or 'none'})")
    try:
        import pai_zoo_conformance  # noqa: F401 - the checks the draft is measured with
    except ImportError:
        raise ScaffoldError("plugin new measures the plugin with the conformance suite, which is not installed",
                            hint="pip install pai-zoo-conformance (in this tree: pip install -e conformance)") from None
    src = read_source(source)
    _check_name(name, src.architecture, src.model_type)
    draft = infer(name, src, like)
    search(draft)
    write_plugin(draft, Path(output) if output is not None else Path.cwd() / draft.distribution, force=force)
    return draft


def write_plugin(draft: Draft, folder: Path, force: bool = False) -> Path:
    """Write the distribution's files into ``folder`` by :mod:`pai_zoo.util.outputs`' rule (a temporary
    ``.NAME.pai-zoo-tmp-PID`` renamed at the end; an existing folder only with ``force``, then replaced)."""
    folder = Path(folder)
    with output_folder(folder, force=force) as tmp:
        files = {
            "pyproject.toml": pyproject(draft),
            "README.md": readme(draft),
            f"{draft.package}/__init__.py": package_init(draft),
            f"{draft.package}/presets.py": presets_module(draft),
            "tests/test_conformance.py": conformance_test(draft),
        }
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8")
    return folder
