"""Hugging Face Hub ids wherever pai-zoo takes a checkpoint folder (docs/hub.md).

:func:`local_path` turns ``"org/name"`` into the folder of its snapshot in the Hugging Face cache, through
``huggingface_hub`` (its cache layout, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``, its progress
bars). The rules, in order: an existing local path wins; a name without a slash is never a Hub id (a preset or
family stays one); ``org/name`` that ``huggingface_hub.utils.validate_repo_id`` accepts is a Hub id.

The cache comes first: a snapshot already there (``refs/<revision>`` or ``snapshots/<commit>``) holding a config
and its weights is used without any network call. Otherwise, online, only the model's files are downloaded
(:func:`model_patterns`); offline (``HF_HUB_OFFLINE=1`` or no network), a model missing from the cache is one line
naming the id, the cache folder and how to fill it. Processes of one machine download once: a file lock in the
cache folder lets one download while the others wait, then find the snapshot cached.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from ..plugin.errors import PaiZooError

__all__ = ["HubError", "cache_folder", "hub_paths", "is_hub_id", "local_path", "model_patterns", "snapshot"]

_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]*[A-Za-z0-9_]")
#: a model's files besides its weights: configs, tokenizers, chat templates, remote code
OTHER_FILES = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py", "tokenizer*", "vocab*", "merges*")
#: the files a tokenizer needs (``--tokenizer org/name``: no weights)
TOKENIZER_FILES = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py", "tokenizer*", "vocab*", "merges*")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class HubError(PaiZooError):
    """A Hub id that cannot be resolved (missing offline, gated, not found, unknown revision): one line."""


def is_hub_id(name) -> bool:
    """Whether ``name`` is a Hub id: ``org/name`` that is no existing local path and that ``huggingface_hub``
    accepts as a repository id."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    text = os.fspath(name)
    if not _ID.fullmatch(text) or Path(text).exists():
        return False
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def cache_folder() -> Path:
    """The Hugging Face cache that ids resolve in (``HF_HUB_CACHE``, else ``HF_HOME/hub``), as huggingface_hub
    reads it."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def model_patterns(files, weights: bool = True) -> list[str]:
    """The ``allow_patterns`` for a repository holding ``files``: configs and tokenizer files, and the weights once
    (safetensors when there are any: ``model*.safetensors`` when those are the model's, else every top-level
    ``*.safetensors``; otherwise PyTorch ``.bin`` files), never GGUF/ONNX/other exports or ``original/``."""
    if not weights:
        return list(TOKENIZER_FILES)
    top = [f for f in files if "/" not in f]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    if any(f.startswith("model") for f in safetensors):
        found = ["model*.safetensors", "model.safetensors.index.json"]
    elif safetensors:
        found = ["*.safetensors", "*.safetensors.index.json"]
    else:
        found = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
    return [*OTHER_FILES, *found]


def _complete(folder: Path, weights: bool) -> bool:
    """Whether a cached snapshot holds a model (its config and every weight file its index names) or, for a
    tokenizer, any file: a snapshot transformers cached for a config alone is not a model."""
    if not weights:
        return any(folder.iterdir())
    if not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):  # a model, a PEFT
        return False
    for index in folder.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((folder / shard).is_file() for shard in shards)
    return any(f.suffix in _WEIGHT_SUFFIXES and f.is_file() for f in folder.iterdir())


def _cached(repo_id: str, revision: str | None, weights: bool) -> Path | None:
    """The cached snapshot of ``repo_id`` at ``revision`` (no network call), or None where it is missing or
    incomplete."""
    import huggingface_hub as hh
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, LocalEntryNotFoundError

    try:  # the listing huggingface_hub cached with the download, so that its completeness check sees our patterns
        patterns = model_patterns([f.path for f in hh.get_cached_repo_tree(repo_id, revision=revision)], weights)
    except (CachedRepoTreeNotFoundError, OSError, ValueError):
        patterns = None
    try:
        folder = Path(hh.snapshot_download(repo_id, revision=revision, local_files_only=True,
                                           allow_patterns=patterns))
    except LocalEntryNotFoundError:
        return None
    return folder if folder.is_dir() and _complete(folder, weights) else None


def _named(repo_id: str, revision: str | None) -> str:
    return repo_id + (f" (revision {revision})" if revision else "")


def _not_cached(repo_id: str, revision: str | None, why: str) -> HubError:
    fill = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    cache = cache_folder()
    return HubError(f"{_named(repo_id, revision)}: no such local folder, and not in the Hugging Face cache {cache} "
                    f"while {why}; fill the cache on a machine with network (`{fill}` with HF_HUB_CACHE={cache}, or "
                    f"copy its {_folder_name(repo_id)} folder into {cache}), then run this again")


def _folder_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _download(repo_id: str, revision: str | None, weights: bool) -> Path:
    import httpx2
    import huggingface_hub as hh
    from huggingface_hub import errors

    named = _named(repo_id, revision)
    try:
        info = hh.HfApi().model_info(repo_id, revision=revision)
        patterns = model_patterns([s.rfilename for s in info.siblings or ()], weights)
        with _download_bars():
            return Path(hh.snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except errors.GatedRepoError:
        raise HubError(f"{named}: a gated model on the Hugging Face Hub; accept its terms at "
                       f"https://huggingface.co/{repo_id} and give a token of that account (HF_TOKEN=..., or "
                       "`hf auth login`)") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{repo_id}: no revision {revision!r} on the Hugging Face Hub; give a branch, tag or commit "
                       "it has (--revision)") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{repo_id}: no such local folder, and no model {repo_id} on the Hugging Face Hub (a private "
                       "one needs a token: HF_TOKEN=...)") from None
    except (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError, httpx2.TransportError) as exc:
        raise _not_cached(repo_id, revision, f"the Hub cannot be reached ({type(exc).__name__})") from None
    except errors.HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", "?")
        raise HubError(f"{named}: the Hugging Face Hub answered {status} ({str(exc).splitlines()[0]})") from None


@contextlib.contextmanager
def _download_bars():
    """huggingface_hub's progress bars on for a download, also in a quiet run (which turns transformers' bars off,
    and with them huggingface_hub's); ``HF_HUB_DISABLE_PROGRESS_BARS=1`` still keeps them off."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_off = are_progress_bars_disabled()
    if was_off and not constants.HF_HUB_DISABLE_PROGRESS_BARS:
        enable_progress_bars()
    try:
        yield
    finally:
        if was_off and not constants.HF_HUB_DISABLE_PROGRESS_BARS:
            disable_progress_bars()


def _lock(repo_id: str):
    """A lock per model in the cache folder, or a no-op where the cache cannot take one (a read-only cache)."""
    from filelock import FileLock

    folder = cache_folder() / ".locks" / "pai-zoo"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f"{_folder_name(repo_id)}.lock"))
        lock.acquire()
    except OSError:
        return contextlib.nullcontext()
    lock.release()
    return lock


def snapshot(repo_id: str, revision: str | None = None, *, weights: bool = True) -> Path:
    """The local folder of ``repo_id`` at ``revision`` (default: the default branch): the cached snapshot, else
    downloaded (model files only; ``weights=False``: tokenizer and config files); :class:`HubError` otherwise."""
    found = _cached(repo_id, revision, weights)
    if found is not None:
        return found
    if _offline():
        raise _not_cached(repo_id, revision, "HF_HUB_OFFLINE is set")
    with _lock(repo_id):  # one process per machine downloads; the others find it cached once the lock is theirs
        found = _cached(repo_id, revision, weights)
        return found if found is not None else _download(repo_id, revision, weights)


def local_path(name, revision: str | None = None, *, weights: bool = True):
    """``name`` as given, or, for a Hub id (:func:`is_hub_id`), its snapshot folder (:func:`snapshot`)."""
    if name is None or not is_hub_id(name):
        return name
    return snapshot(os.fspath(name), revision, weights=weights)


def hub_paths(revision, *models, tokenizer=None, flag: str = "revision=") -> tuple:
    """``(*models, tokenizer)`` with each Hub id replaced by its snapshot folder: the models' at ``revision``, the
    tokenizer's (config and tokenizer files only) at its default branch. ``revision`` with no Hub id among the
    models is refused, naming ``flag``."""
    if revision is not None and not any(is_hub_id(n) for n in models if n is not None):
        given = ", ".join(str(n) for n in models if n is not None) or "no model"
        raise HubError(f"{flag}{revision}: a revision is for a Hugging Face Hub id (org/name), and {given} is a "
                       "local path, preset or family; leave the revision out")
    return (*(local_path(n, revision) for n in models), local_path(tokenizer, weights=False))
