"""A LoRA run's folder and adapters from wherever they are kept.

A LoRA run (``train --peft lora --save RUN``) writes ``RUN/lora.json``: the settings and the base it adapts
(``path``, ``kind`` and ``sha256``, a hash of the base's weight files' contents), beside its checkpoints, which hold
the adapters only (global names, mcore form: :mod:`pai_zoo.lora.targets`). :func:`adapter_source` reads either
such a run or a PEFT folder.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..mapping import MappingContext
from ..registry import get_registry
from ..util.files import write_text_atomic
from .peft_format import is_peft_folder, read_peft_adapter
from .settings import LORA_RECORD, LoraError, LoraSettings
from .targets import ADAPTERS, lora_targets, to_mcore_form

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".distcp", ".pt")


def is_lora_run(path) -> bool:
    return (Path(path) / LORA_RECORD).is_file()


def weight_files(path) -> list[Path]:
    """The files whose contents make a base model: an HF folder's weight files, or a megatron-core checkpoint's
    current iteration (its ``.metadata`` too)."""
    from ..mcore.dist_ckpt import is_mcore_checkpoint, iteration_dir

    path = Path(path)
    folder = iteration_dir(path) if is_mcore_checkpoint(path) else path
    files = sorted(f for f in folder.iterdir() if f.is_file() and (f.suffix in _WEIGHT_SUFFIXES
                                                                  or f.name == ".metadata"))
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
    write_text_atomic(Path(run) / LORA_RECORD, json.dumps(record, indent=2) + "\n")


def read_record(run) -> dict:
    file = Path(run) / LORA_RECORD
    try:
        record = json.loads(file.read_text())
        LoraSettings.from_dict(record["settings"])
        record["base"]["sha256"]
    except FileNotFoundError:
        raise LoraError(f"{run}: not a LoRA run (no {LORA_RECORD})") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise LoraError(f"{file}: not a LoRA record ({type(e).__name__}: {e})") from None
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
    from ..mcore.dist_ckpt import DistCheckpointReader, is_mcore_checkpoint, iteration_dir

    if not is_mcore_checkpoint(run):
        raise LoraError(f"{run}: a LoRA run with no checkpoint yet (no latest_checkpointed_iteration.txt)")
    reader = DistCheckpointReader(iteration_dir(run))
    try:
        keys = [k for k in reader.keys() if k.startswith("decoder.") and f".{ADAPTERS}." in k]
        if not keys:
            raise LoraError(f"{iteration_dir(run)}: holds no LoRA adapters")
        return {k: reader.read(k, [0] * len(reader.global_shape(k)), reader.global_shape(k)) for k in keys}
    finally:
        reader.close()


def adapter_source(path, family, config) -> tuple[LoraSettings, dict, dict | None]:
    """``(settings, adapters in mcore form, the run's record or None)`` of a LoRA run folder or a PEFT folder,
    for a model of ``family`` with megatron-core ``config``."""
    path = Path(path)
    if is_lora_run(path):
        record = read_record(path)
        return LoraSettings.from_dict(record["settings"]), run_adapters(path), record
    if is_peft_folder(path):
        settings, adapters = read_peft_adapter(path, family)
        table = get_registry().weight_map(family, config)
        ctx = MappingContext.from_config(config)
        try:
            return settings, to_mcore_form(adapters, lora_targets(table), config, ctx), None
        except LoraError as e:
            raise LoraError(f"{path}: {e}") from None
    if not path.exists():
        raise LoraError(f"no such file or folder: {path} (the adapter: a LoRA run folder or a PEFT folder)")
    raise LoraError(f"{path}: neither a LoRA run ({LORA_RECORD}) nor a PEFT adapter folder (adapter_config.json)")
