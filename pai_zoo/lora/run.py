"""A LoRA run's folder and adapters from wherever they are kept.

A LoRA run (``train --peft lora --save RUN``) writes ``RUN/lora.json``: the settings and the base it adapts
(``path``, ``kind`` and ``sha256``, a hash of the base's weight files' contents), beside its checkpoints, which hold
the adapters only (global names, mcore form: :mod:`pai_zoo.lora.targets`). :func:`adapter_source` reads either
such a run or a PEFT folder.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .. import formats
from ..families.registry import get_registry
from ..formats import training_run
from ..formats.peft_adapter import PEFT_CONFIG, read_peft_adapter
from ..plugin.errors import PaiZooError
from ..tables.mapping import MappingContext
from .settings import LoraError, LoraSettings
from .targets import ADAPTERS, lora_targets, to_mcore_form

LORA_RECORD = training_run.LORA_RECORD
is_lora_run = training_run.is_lora_run


def weight_files(path) -> list[Path]:
    """The files whose contents make a base model: an HF folder's weight files, or a megatron-core checkpoint's
    current iteration (its ``.metadata`` too)."""
    try:
        with formats.open_checkpoint(path) as base:
            files = base.weight_files()
    except PaiZooError:
        files = []
    if not files:
        raise LoraError(f"{path}: no weight files to identify the base by")
    return files


def base_fingerprint(path) -> str:
    """sha256 over the names and contents of the base's weight files (read once, 8 MiB at a time)."""
    digest = hashlib.sha256()
    for file in weight_files(path):
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as f:
            while block := f.read(8 << 20):
                digest.update(block)
    return digest.hexdigest()


def write_record(run: Path, settings: LoraSettings, base: Path, kind: str, targets: list[str]) -> None:
    """``RUN/lora.json`` (rank 0, before the first checkpoint)."""
    record = {"format": 1, "settings": settings.to_dict(), "targets": sorted(targets),
              "base": {"path": str(Path(base).resolve()), "kind": kind, "sha256": base_fingerprint(base)}}
    training_run.write_lora_record(run, record)


def read_record(run) -> dict:
    try:
        record = training_run.read_lora_record(run)
    except PaiZooError as e:
        raise LoraError(str(e)) from None
    try:
        LoraSettings.from_dict(record["settings"])
        record["base"]["sha256"]
    except (KeyError, TypeError) as e:
        raise LoraError(f"{Path(run) / LORA_RECORD}: not a LoRA record ({type(e).__name__}: {e})") from None
    return record


def check_base(record: dict, base, where) -> None:
    """Refuse ``base`` unless it is the base ``record`` was trained on (same weight contents)."""
    want = record["base"]
    if not Path(base).exists():
        raise LoraError(f"{where}: its base {base} is missing (the run adapts {want['path']})")
    if base_fingerprint(base) != want["sha256"]:
        raise LoraError(f"{where}: adapts the base at {want['path']} (sha256 {want['sha256'][:12]}...); {base} holds "
                        "other weights (a changed or another base); give the base the run was trained on")


def run_adapters(run) -> dict:
    """The adapters of a LoRA run's latest checkpoint, full, in mcore form."""
    if training_run.latest_iteration(run) is None:
        raise LoraError(f"{run}: a LoRA run with no checkpoint yet (no {training_run.TRACKER})")
    with formats.open_checkpoint(run, format="lora-run") as checkpoint:
        keys = [k for k in checkpoint.names() if k.startswith("decoder.") and f".{ADAPTERS}." in k]
        if not keys:
            raise LoraError(f"{checkpoint.folder}: holds no LoRA adapters")
        return {k: checkpoint.read(k) for k in keys}


def adapter_source(path, family, config) -> tuple[LoraSettings, dict, dict | None]:
    """``(settings, adapters in mcore form, the run's record or None)`` of a LoRA run folder or a PEFT folder,
    for a model of ``family`` with megatron-core ``config``."""
    path = Path(path)
    kind = _format(path)
    if kind == "lora-run":
        record = read_record(path)
        return LoraSettings.from_dict(record["settings"]), run_adapters(path), record
    if kind == "peft":
        settings, adapters = read_peft_adapter(path, family)
        table = get_registry().weight_map(family, config)
        ctx = MappingContext.from_config(config)
        try:
            return settings, to_mcore_form(adapters, lora_targets(table), config, ctx), None
        except LoraError as e:
            raise LoraError(f"{path}: {e}") from None
    if not path.exists():
        raise LoraError(f"no such file or folder: {path} (the adapter: a LoRA run folder or a PEFT folder)")
    raise LoraError(f"{path}: neither a LoRA run ({LORA_RECORD}) nor a PEFT adapter folder ({PEFT_CONFIG})")


def _format(path: Path) -> str | None:
    try:
        return formats.detect(path)
    except PaiZooError:
        return None
