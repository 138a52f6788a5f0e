"""``train --save DIR`` and ``rl NAME --save DIR`` under the output rule, checked before any model loads.

- ``DIR`` missing: it is created when the run sets up; its nearest existing parent must be a writable folder
  (:func:`pai_zoo.util.outputs.check_output`; an existing ``DIR`` must be writable too).
- ``DIR`` empty: fine.
- ``DIR`` a pai-zoo training run (:func:`is_training_run`): the same command resumes it; a run of another model
  (another family, or other layer count / hidden size) is refused: it cannot be continued with ``--model``.
- ``DIR`` holding anything else: refused in one line unless ``--force`` (then the run writes beside those files).

:func:`cleanup_on_failure` removes a ``DIR`` that this run created when the run fails before it saved anything.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..formats.megatron_folder import PAI_ZOO_CONFIG, TRACKER, has_tracker
from ..formats.training_run import CONFIG_FILE, LORA_RECORD, METRICS_FILE, RL_ROLES
from ..models.handle import resolve
from ..plugin.errors import PaiZooError
from ..util.outputs import TMP_MARK, check_output

__all__ = ["SaveDirError", "check_save_dir", "cleanup_on_failure", "is_training_run", "run_files"]

#: what marks a folder as a pai-zoo run (beside its iterations ``iter_N`` and an RL run's ``actor/``, ``critic/``);
#: it also writes ``pai_zoo.json``, ``hf/`` and ``data_cache/``, names too common to mark a run by themselves
RUN_FILES = (TRACKER, TRACKER + ".tmp", CONFIG_FILE, METRICS_FILE, LORA_RECORD)
_ITERATION = re.compile(r"^iter_\d{7}(\.tmp)?$")


class SaveDirError(PaiZooError):
    """A ``--save`` folder that this run may not write into (the message says why and what to do)."""


def run_files(path) -> list[str]:
    """The entries of ``path`` that mark a pai-zoo run (an RL run's ``actor/`` and ``critic/`` included)."""
    path = Path(path)
    found = []
    for entry in sorted(os.listdir(path)):
        if entry in RUN_FILES or _ITERATION.match(entry) or (entry in RL_ROLES and is_training_run(path / entry)):
            found.append(entry)
    return found


def is_training_run(path) -> bool:
    """Whether ``path`` is a folder a pai-zoo ``train`` or ``rl`` run wrote (its tracker, settings, metrics or
    iterations), saved or begun."""
    path = Path(path)
    return path.is_dir() and bool(run_files(path))


def _others(path: Path) -> list[str]:
    """The entries of a folder that is no run, but for pai-zoo's temporaries (another rank's probe, or one a
    killed run left: the next writer removes it)."""
    return [e for e in sorted(os.listdir(path)) if TMP_MARK not in e]


def check_save_dir(save, *, force: bool = False, model: str | None = None, option: str = "--save") -> bool:
    """Refuse a ``--save`` folder this run must not write into (see the module docstring); returns whether it is
    an existing run (a resume). ``model``: the ``--model`` of the run, compared with a saved run's model."""
    save = Path(save)
    if save.exists() and not save.is_dir():
        raise SaveDirError(f"{option} {save}: a file, not a folder; choose another {option}")
    if not save.exists():  # its nearest existing folder must take a file (tried for real: modes do not stop root)
        check_output(save, force=True, kind="folder", flag=option, echo=False)  # force: another rank may make it
        return False
    probe = save / TRACKER  # a file the run writes there; only its temporary name is tried
    try:
        check_output(probe, force=True, flag=option, echo=False)
    except PaiZooError as e:
        raise SaveDirError(str(e).replace(str(probe), str(save))) from None
    if has_tracker(save) and not any((save / f).is_file() for f in (CONFIG_FILE, METRICS_FILE)):
        raise SaveDirError(f"{option} {save}: a Megatron checkpoint (a model to start from, --model), not a pai-zoo "
                           f"training run to resume; choose another {option}")
    if not is_training_run(save):
        others = _others(save)
        if force or not others:
            return False
        names = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise SaveDirError(f"{save} holds files that are not a pai-zoo training run ({names}); choose another "
                           f"{option} or pass --force to train into it")
    if model is not None:
        _check_same_model(save, model, option)
    return True


def _saved_model(save: Path) -> tuple[str | None, dict]:
    """The saved run's ``--model`` (train_config.json) and architecture (pai_zoo.json's mcore_config)."""
    model, config = None, {}
    try:
        model = json.loads((save / CONFIG_FILE).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        pass
    try:
        config = json.loads((save / PAI_ZOO_CONFIG).read_text()).get("mcore_config") or {}
    except (OSError, ValueError, AttributeError):
        pass
    return model, config


def _check_same_model(save: Path, model: str, option: str) -> None:
    saved_model, saved = _saved_model(save)
    if saved_model is None or str(saved_model) == str(model) or not saved.get("family"):
        return
    try:
        source = resolve(model)
    except PaiZooError:
        return  # --model's own error comes later, naming the flag
    family = source.family.name
    differences = []
    if family != saved["family"]:
        differences.append(f"family {saved['family']} -> {family}")
    else:
        arch = saved.get("arch") or {}
        mine = source.mcore_config.arch if source.mcore_config is not None else {
            "num_layers": (source.hf_config or {}).get("num_hidden_layers"),
            "hidden_size": (source.hf_config or {}).get("hidden_size")}
        for key in ("num_layers", "hidden_size"):
            if arch.get(key) is not None and mine.get(key) is not None and arch[key] != mine[key]:
                differences.append(f"{key} {arch[key]} -> {mine[key]}")
    if differences:
        raise SaveDirError(f"{save} holds a training run of {saved_model} ({saved['family']}), not of --model "
                           f"{model} ({'; '.join(differences)}): it cannot be resumed with another model; choose "
                           f"another {option}")


def cleanup_on_failure(save, created: bool) -> bool:
    """After a failed run: remove ``save`` if this run ``created`` it and it holds no saved iteration (only what the
    run wrote while setting up). Returns whether it was removed."""
    save = Path(save)
    if not created or not save.is_dir():
        return False
    if has_tracker(save) or any(has_tracker(save / role) for role in RL_ROLES):
        return False
    shutil.rmtree(save, ignore_errors=True)
    return not save.exists()
