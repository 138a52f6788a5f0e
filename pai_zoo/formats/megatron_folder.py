"""The folder structure every Megatron checkpoint shares, whoever wrote it (Megatron-LM, pai-zoo's ``convert``, a
pai-zoo run): ``latest_checkpointed_iteration.txt`` naming the latest iteration, ``release/`` or ``iter_NNNNNNN/``
folders, and which of the two formats an iteration folder holds. It is no format of its own: the formats' modules
(:mod:`.mcore_dist` for ``torch_dist``, :mod:`.megatron_legacy` for legacy ``torch``) read what is inside.

- ``torch_dist``: ``iter_N/.metadata`` + ``*.distcp`` (``torch.distributed.checkpoint``);
- legacy ``torch``: ``iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``, one file per model-parallel rank.

Their common state (``args``, ``iteration`` ...) is a pickle, read by :func:`pai_zoo.formats.safe_pickle.safe_load`.

"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from ..plugin.errors import PaiZooError, no_such_path

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
LEGACY_FILE = "model_optim_rng.pt"
METADATA_FILE = ".metadata"  # a torch_dist iteration folder's index of its tensors
COMMON_FILE = "common.pt"  # a torch_dist iteration folder's non-tensor state (args, iteration ...)
COMMON_STATE_KEY = "common_state"  # the ShardedObject that holds the common state instead (newer Megatron-LM)
#: A legacy iteration's folder of one model-parallel rank: ``mp_rank_TT[_PPP][_EEE]``.
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
#: pai-zoo's description of the model beside the iterations (what ``convert`` and training write).
PAI_ZOO_CONFIG = "pai_zoo.json"
#: pai-zoo's folder of the model's Hugging Face files beside the iterations.
HF_DIR = "hf"


class MegatronCheckpointError(PaiZooError):
    """A Megatron-LM checkpoint folder that cannot be read as it is (the message names the file and the fix)."""


@dataclass
class IterationFolder:
    """One saved iteration of a Megatron checkpoint: where it is and in which format."""

    root: Path
    folder: Path
    iteration: int | str  # a number, or "release"
    format: str  # "torch_dist" or "torch"

    @property
    def name(self) -> str:
        return f"{self.format} checkpoint {self.folder}"


def _iteration_name(iteration: int | str) -> str:
    return RELEASE if iteration == RELEASE else iteration_name(int(iteration))


def saved_iterations(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p.name == RELEASE or p.name.startswith("iter_")))


def iteration_folder(root, iteration: int | str | None = None) -> IterationFolder:
    """The iteration to read: ``iteration`` (a number or ``"release"``), else the tracker file's, else a lone
    ``release/`` folder."""
    root = Path(root)
    if not root.is_dir():
        raise no_such_path(root, "the Megatron checkpoint to read")
    tracker = root / TRACKER
    if iteration is None and tracker.is_file():
        value = tracker.read_text().strip()
        if value != RELEASE and not value.isdigit():
            raise MegatronCheckpointError(f"{tracker}: expected 'release' or an iteration number, found {value!r}")
        iteration = value if value == RELEASE else int(value)
    elif iteration is None and (root / RELEASE).is_dir():
        iteration = RELEASE
    elif iteration is None:
        raise MegatronCheckpointError(f"{root}: no {TRACKER} and no {RELEASE}/ folder; pass --iteration N "
                                      f"(saved: {', '.join(saved_iterations(root)) or 'none'})")
    elif str(iteration) != RELEASE:
        iteration = int(iteration)
    folder = root / _iteration_name(iteration)
    if not folder.is_dir():
        raise MegatronCheckpointError(
            f"{folder}: iteration {iteration} was not saved in {root} "
            f"(saved: {', '.join(saved_iterations(root)) or 'none'}); pass --iteration with one of them")
    if (folder / METADATA_FILE).is_file():
        fmt = "torch_dist"
    elif any(RANK_DIR.match(p.name) for p in folder.iterdir()):
        fmt = "torch"
    else:
        raise MegatronCheckpointError(f"{folder}: neither a torch_dist checkpoint (no .metadata) nor a legacy one "
                                      f"(no mp_rank_* folders)")
    return IterationFolder(root, folder, iteration, fmt)


def checkpoint_args(it: IterationFolder, common: dict) -> dict:
    where = it.folder / ("common.pt" if it.format == "torch_dist" else "mp_rank_*/" + LEGACY_FILE)
    args = common.get("args")
    if args is None:
        raise MegatronCheckpointError(f"{where}: no 'args' entry: the checkpoint does not record its "
                                      "architecture (save it with Megatron-LM's save_checkpoint)")
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)


def is_megatron_folder(path) -> bool:
    """A Megatron checkpoint folder of either format: a tracker file, or a ``release/`` / ``iter_*`` folder."""
    path = Path(path)
    if (path / TRACKER).is_file():
        return True
    return path.is_dir() and any(p.is_dir() and (p.name == RELEASE or p.name.startswith("iter_"))
                                 for p in path.iterdir())


def has_tracker(path) -> bool:
    return (Path(path) / TRACKER).is_file()


def iteration_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def iteration_dir(path) -> Path:
    """The folder of the iteration that ``latest_checkpointed_iteration.txt`` names."""
    tracker = Path(path) / TRACKER
    value = tracker.read_text().strip()
    if value == RELEASE:
        return Path(path) / RELEASE
    try:
        return Path(path) / iteration_name(int(value))
    except ValueError:
        raise PaiZooError(f"{tracker}: expected 'release' or an iteration number, found {value!r}") from None


def latest_iteration(folder) -> int | None:
    """The iteration the tracker names, or ``None`` without a (numeric) tracker."""
    tracker = Path(folder) / TRACKER
    if not tracker.is_file():
        return None
    value = tracker.read_text().strip()
    if not value.isdigit():
        return None
    if not iteration_dir(folder).is_dir():
        raise PaiZooError(f"{tracker} names iteration {value}, but {iteration_dir(folder)} is missing")
    return int(value)


def recorded_tensors(path, file: str) -> dict | None:
    """The tensors a converted checkpoint kept beside its HF side (``hf/FILE``: the FP8 or MXFP4 scales of the folder
    it was converted from), by their HF names; ``None`` when it kept none."""
    stored = Path(path) / HF_DIR / file
    if not stored.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(stored)
