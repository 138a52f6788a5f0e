"""pai-zoo training-run folders: what ``pai-zoo train --save RUN`` and ``pai-zoo rl ... --save RUN`` write.

A run folder is a pai-zoo Megatron-Core checkpoint (:mod:`.mcore_dist`: the tracker, ``pai_zoo.json``, ``hf/``)
whose iterations are ``iter_NNNNNNN/`` (model, optimizer, scheduler, RNG state, data position), plus::

    RUN/train_config.json     the run's settings (checked when it resumes)
    RUN/metrics.jsonl         one line per logged step
    RUN/lora.json             a LoRA run: its settings and the base it adapts (its iterations hold adapters only)

An RL run keeps one such folder per model: ``RUN/actor/`` (the policy) and ``RUN/critic/``.

An iteration is saved into ``iter_N.tmp`` and published by :func:`publish_iteration` (renamed, then the tracker
replaced), so an interrupted save leaves the previous iteration as the latest. Reading a run's tensors is reading a
Megatron-Core checkpoint: :func:`pai_zoo.formats.open_checkpoint` opens one with :class:`.McoreDistCheckpoint`.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..plugin.errors import PaiZooError
from ..util.files import publish, write_text_atomic
from ..util.json_errors import json_msg
from .megatron_folder import TRACKER, has_tracker, iteration_dir, iteration_name, latest_iteration

__all__ = ["CONFIG_FILE", "LORA_RECORD", "METRICS_FILE", "RL_ROLES", "TRACKER", "is_lora_run", "iteration_dir",
           "iteration_name", "latest_iteration", "publish_iteration", "read_lora_record", "read_run_config",
           "rl_model", "write_lora_record", "write_run_config"]

CONFIG_FILE = "train_config.json"
METRICS_FILE = "metrics.jsonl"
#: the run folder's record of a LoRA run: its settings and the base it adapts (path and content hash)
LORA_RECORD = "lora.json"
#: An RL run's models, one run folder each.
RL_ROLES = ("actor", "critic")


def is_lora_run(path) -> bool:
    return (Path(path) / LORA_RECORD).is_file()


def rl_model(path, role: str = "actor") -> Path | None:
    """``RUN/actor`` (or ``role``) of an RL run folder, ``None`` when ``path`` is not one."""
    path = Path(path)
    if has_tracker(path) or not has_tracker(path / role):
        return None
    return path / role


def read_lora_record(run) -> dict:
    """``RUN/lora.json`` as a dict; a missing or damaged one is one line naming it."""
    file = Path(run) / LORA_RECORD
    try:
        record = json.loads(file.read_text())
    except FileNotFoundError:
        raise PaiZooError(f"{run}: not a LoRA run (no {LORA_RECORD})") from None
    except json.JSONDecodeError as e:
        raise PaiZooError(f"{file}: not a LoRA record (JSONDecodeError: {e})") from None
    return record


def write_lora_record(run, record: dict) -> None:
    write_text_atomic(Path(run) / LORA_RECORD, json.dumps(record, indent=2) + "\n")


def read_run_config(run) -> dict | None:
    """``RUN/train_config.json``, ``None`` before the run wrote one."""
    file = Path(run) / CONFIG_FILE
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise PaiZooError(f"{file}: line {e.lineno}: not JSON: {json_msg(e)}; the run's settings are damaged") from None


def write_run_config(run, settings: dict) -> None:
    write_text_atomic(Path(run) / CONFIG_FILE, json.dumps(settings, indent=2) + "\n")


def publish_iteration(run, tmp, iteration: int) -> Path:
    """Make the complete iteration folder ``tmp`` the run's ``iter_N`` and the latest (tracker replaced), durably;
    an ``iter_N`` left by a run killed between the rename and the tracker update is replaced."""
    run = Path(run)
    final = publish(tmp, run / iteration_name(iteration), replace=True, durable=True)
    # the tracker's temporary has a fixed name, so a killed save leaves none behind
    write_text_atomic(run / TRACKER, str(iteration), tmp=run / (TRACKER + ".tmp"), durable=True)
    return final
