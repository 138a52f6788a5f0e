"""What a tokenizer name or path means, decided in one place for ``preprocess``, ``dataset inspect``,
:func:`pai_zoo.load` (and so ``generate`` and ``rl``) and ``train``.

* a folder or a file: the tokenizer files there (a Megatron-Core checkpoint's ``hf/`` side), read through the
  ``pai_zoo_tokenizer`` hook of the family its ``config.json`` names;
* a test preset (``llama3-tiny``, see :attr:`pai_zoo.Family.test_presets`): the family's toy
  ``test_tokenizer``, whose ids all lie below the preset's ``vocab_size``;
* a published preset (``mistral-7b``): the family's real ``published_tokenizer`` when the plugin lists the preset
  in ``published_tokenizer_presets`` and the tokenizer fits its ``vocab_size``; a family name (``qwen2``) means it
  only when it is the tokenizer of every published preset. Anything else is refused
  (:class:`NoBundledTokenizerError`: pass the checkpoint's folder): a toy tokenizer is never given for a published
  model.

Bundled tokenizers are written once under pai-zoo's cache folder (``$PAI_ZOO_CACHE``, default
``~/.cache/pai-zoo``; :func:`pai_zoo.util.cache.cache_dir`) and read from there. This module imports no
third-party package.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from ..families.registry import get_registry
from ..formats.hf_folder import is_hf_checkpoint, read_config
from ..plugin.errors import NoBundledTokenizerError, PaiZooError, looks_like_path, no_such_path
from ..util.cache import cache_dir
from ..util.files import atomic_folder
from .loader import load_tokenizer

__all__ = ["NoBundledTokenizerError", "TokenizerRef", "bundled_tokenizer_folder", "describe_tokenizer",
           "family_tokenizer", "model_files_folder", "model_tokenizer", "resolve_tokenizer"]

# pai_zoo.mcore.dist_ckpt's names (not imported here: that module imports torch).


class TokenizerRef(NamedTuple):
    """A resolved tokenizer: its folder or file, and the name of the family whose hook reads it (picklable,
    for preprocessing workers)."""

    path: str
    family: str | None = None

    def load(self):
        """The :class:`pai_zoo.tokenizers.Tokenizer` (through the family's ``pai_zoo_tokenizer`` hook if known)."""

        if self.family is None:
            return load_tokenizer(self.path)
        return family_tokenizer(get_registry().family(self.family), self.path)


def family_tokenizer(family, path, registry=None):
    """The tokenizer of ``family``'s checkpoint folder or tokenizer file ``path``: the first plugin's answer to the
    ``pai_zoo_tokenizer`` hook, else the core's reader (:func:`pai_zoo.tokenizers.load_tokenizer`)."""

    found = (registry or get_registry()).plugin_tokenizer(family, path)
    return found if found is not None else load_tokenizer(path)


def bundled_tokenizer_folder(family, kind: str = "test") -> Path:
    """The folder of a family's bundled tokenizer, ``kind`` ``"test"`` (``Family.test_tokenizer``) or
    ``"published"`` (``Family.published_tokenizer``), written under pai-zoo's cache folder on first use
    (through a temporary folder, so concurrent processes never see half a tokenizer)."""

    root = cache_dir()
    if kind == "test":
        writer, parent = family.test_tokenizer, root / "test-tokenizers"
    elif kind == "published":
        writer, parent = family.published_tokenizer, root / "tokenizers"
    else:
        raise ValueError(f"kind must be 'test' or 'published', not {kind!r}")
    folder = parent / f"{family.name}-{_writer_digest(writer, get_registry().plugins.get(family.plugin))}"
    if folder.is_dir():
        return folder
    if writer is None:
        attribute = "test_tokenizer" if kind == "test" else "published_tokenizer"
        raise PaiZooError(f"family {family.name!r} bundles no {kind} tokenizer (Family.{attribute}); "
                          "pass a checkpoint folder or a tokenizer file")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(folder, exist_ok=True) as tmp:  # exist_ok: another process wrote it first, use theirs
        writer(tmp)
    return folder


def _writer_digest(writer, plugin) -> str:
    """A short digest of what a tokenizer writer writes: the writer (a data-driven callable's
    parameters), the source file that defines it and the plugin's version, so that a changed writer
    (an editable install, a new release) never reads an older cached folder."""
    import hashlib
    import inspect

    described = repr(writer)
    if " at 0x" in described:  # a plain function: its name, not its address
        described = f"{getattr(writer, '__module__', '')}.{getattr(writer, '__qualname__', '')}"
    parts = [described, getattr(plugin, "version", "") or ""]
    for target in (writer, type(writer)):
        try:
            parts.append(Path(inspect.getfile(target)).read_text(errors="replace"))
            break
        except (TypeError, OSError):
            continue
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:12]


def _checkpoint_side(path: Path) -> Path:
    """Where a folder keeps its tokenizer files: ``hf/`` of a Megatron-Core checkpoint, else itself."""
    from ..formats import mcore_dist

    if path.is_dir() and mcore_dist.is_mcore_checkpoint(path) and mcore_dist.hf_side(path) is not None:
        return mcore_dist.hf_side(path)
    return path


def _path_ref(path: Path) -> TokenizerRef:
    import contextlib


    path = _checkpoint_side(path)
    family = None
    if path.is_dir() and is_hf_checkpoint(path):
        with contextlib.suppress(PaiZooError):
            family = get_registry().family_for_hf_config(read_config(path)).name
    return TokenizerRef(str(path), family)


def _published_presets(family) -> list[str]:
    return [p for p in family.presets if not family.is_test_preset(p)]


def _bundled_for(family, name: str) -> bool:
    """Whether ``family``'s :attr:`~pai_zoo.Family.published_tokenizer` is the tokenizer of ``name``: a preset it
    lists in ``published_tokenizer_presets``, or the family's name when it lists every published preset."""
    if family.published_tokenizer is None:
        return False
    listed = {p.lower() for p in family.published_tokenizer_presets}
    if name.lower() in {p.lower() for p in family.presets}:
        return name.lower() in listed
    return all(p.lower() in listed for p in _published_presets(family))


def _example(family, name: str) -> str:
    """A checkpoint folder name for the hint: the preset asked for, else the family's first published preset."""
    if name.lower() in {p.lower() for p in family.presets}:
        return name
    return next(iter(_published_presets(family)), family.name)


def _refusal(family, name: str) -> NoBundledTokenizerError:
    example = _example(family, name)
    is_preset = name.lower() in {p.lower() for p in family.presets}
    where = f"preset {name!r} of family {family.name!r}" if is_preset else f"family {family.name!r}"
    listed = list(family.published_tokenizer_presets) if family.published_tokenizer is not None else []
    others = f" (it bundles one for {', '.join(listed)})" if listed else ""
    return NoBundledTokenizerError(
        f"--tokenizer {name}: {where} bundles no published tokenizer{others}; pass the checkpoint's folder "
        f"(--tokenizer /path/to/{example}) or a tokenizer.json")


def _published_ref(family, name: str) -> TokenizerRef:
    """The bundled published tokenizer of ``name``, checked to fit the preset's vocabulary."""
    ref = TokenizerRef(str(bundled_tokenizer_folder(family, "published")), family.name)
    vocab = family.presets[name].get("vocab_size") if name in family.presets else None
    if vocab is not None:
        size = ref.load().vocab_size
        if size > vocab:
            raise NoBundledTokenizerError(
                f"--tokenizer {name}: the {family.name} plugin's published tokenizer has {size} tokens, more than "
                f"the preset's vocab_size {vocab}; pass the checkpoint's folder or a tokenizer.json")
    return ref


def resolve_tokenizer(spec) -> TokenizerRef:
    """The tokenizer ``spec`` names: a checkpoint folder, a tokenizer file, a test preset (its toy test
    tokenizer), or a family or published preset (its real published tokenizer where the plugin bundles one,
    else :class:`NoBundledTokenizerError`). Unknown names raise :class:`PaiZooError`."""

    path = Path(str(spec)).expanduser()
    if path.exists():
        return _path_ref(path)
    registry = get_registry()
    name = str(spec)
    if registry.is_preset(name):
        family = registry.preset(name)[0]
    elif registry.is_family(name):
        family = registry.family(name)
    else:
        if looks_like_path(name):
            raise no_such_path(path, f"--tokenizer {name}",
                               hint="pass a checkpoint folder, a tokenizer file, a family or a preset")
        raise PaiZooError(f"--tokenizer {name}: not a file, a folder, a family or a preset")
    if family.is_test_preset(name):
        if family.test_tokenizer is None:
            raise PaiZooError(f"--tokenizer {name}: family {family.name!r} has no test tokenizer "
                              "(Family.test_tokenizer); pass a folder or file")
        return TokenizerRef(str(bundled_tokenizer_folder(family, "test")), family.name)
    if not _bundled_for(family, name):
        raise _refusal(family, name)
    return _published_ref(family, _preset_key(family, name))


def _preset_key(family, name: str) -> str:
    """``name`` as the family spells its preset (presets are matched case-insensitively), else ``name``."""
    return next((p for p in family.presets if p.lower() == name.lower()), name)


def describe_tokenizer(family, name: str | None = None) -> str:
    """What ``--tokenizer NAME`` gives (``name`` a preset of ``family``, default the family name), in words for
    ``pai-zoo info``: a test vocabulary, a bundled published tokenizer, or none bundled."""
    name = name or family.name
    if family.is_test_preset(name):
        if family.test_tokenizer is None:
            return "none (the plugin has no test tokenizer)"
        size = TokenizerRef(str(bundled_tokenizer_folder(family, "test")), family.name).load().vocab_size
        return f"test vocabulary ({size} pieces), not a published model's"
    if _bundled_for(family, name):
        size = TokenizerRef(str(bundled_tokenizer_folder(family, "published")), family.name).load().vocab_size
        return f"published tokenizer, bundled by the plugin ({size} pieces)"
    example = _example(family, name)
    listed = f" (bundled for {', '.join(family.published_tokenizer_presets)})" \
        if family.published_tokenizer is not None and family.published_tokenizer_presets else ""
    return f"none bundled{listed}: pass a checkpoint folder (--tokenizer /path/to/{example})"


def model_files_folder(source) -> Path | None:
    """The folder of a model's tokenizer and processor files: a checkpoint's own (a Megatron-Core checkpoint's
    ``hf/`` side, the folder given with a Megatron-LM one), a test preset's bundled test tokenizer, else None."""
    if source.kind == "megatron-lm":
        folder = getattr(source, "tokenizer_dir", None)
        return Path(folder) if folder is not None else None
    if source.path is not None:
        from ..formats import mcore_dist

        return Path(source.path) / mcore_dist.HF_DIR if source.kind == "mcore" else Path(source.path)
    preset = getattr(source, "preset", None)
    if preset and source.family.is_test_preset(preset) and source.family.test_tokenizer is not None:
        return bundled_tokenizer_folder(source.family, "test")
    return None


def model_tokenizer(source, vocab_size: int | None = None):
    """The tokenizer that belongs with a model (a :class:`pai_zoo.models.handle.Source`), or None: a checkpoint's own
    files, a test preset's test tokenizer, or a published preset's bundled published tokenizer, when its ids fit
    ``vocab_size`` (the model's, overrides included). Family names and other presets have none."""
    if source.kind == "megatron-lm":  # its args name no tokenizer files: the folder given with it, if any
        folder = getattr(source, "tokenizer_dir", None)
        return TokenizerRef(str(folder), source.family.name).load() if folder is not None else None
    if source.path is not None:
        from ..formats import mcore_dist

        folder = Path(source.path) / mcore_dist.HF_DIR if source.kind == "mcore" else Path(source.path)
        try:
            return TokenizerRef(str(folder), source.family.name).load()
        except FileNotFoundError:
            return None
    preset = getattr(source, "preset", None)
    family = source.family
    if not preset:
        return None
    if family.is_test_preset(preset):
        if family.test_tokenizer is None:
            return None
        kind = "test"
    elif family.published_tokenizer is not None and preset.lower() in {
            p.lower() for p in family.published_tokenizer_presets}:
        kind = "published"
    else:
        return None
    tokenizer = TokenizerRef(str(bundled_tokenizer_folder(family, kind)), family.name).load()
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        return None  # a vocab_size override left no room for it
    return tokenizer
