"""Hugging Face PEFT's adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``, whose tensors
are ``base_model.model.<module>.lora_A.weight`` [rank, in] and ``...lora_B.weight`` [out, rank] (the names
``peft.get_peft_model_state_dict`` saves). Read into and written from adapters in HF form
(:mod:`pai_zoo.lora.targets`)."""
from __future__ import annotations

import json
from pathlib import Path

from ..lora.settings import LoraError, LoraSettings, peft_config, settings_from_peft_dict
from ..util.json_errors import json_msg
from .base import CheckpointReader, FolderWriter

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def is_peft_folder(path) -> bool:
    return (Path(path) / PEFT_CONFIG).is_file()


def read_peft_config(folder) -> dict:
    """The folder's ``adapter_config.json`` as a dict, errors naming the file and line."""
    file = Path(folder) / PEFT_CONFIG
    if not file.is_file():
        raise LoraError(f"{folder}: not a PEFT adapter folder (no {PEFT_CONFIG})")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise LoraError(f"{file}: line {e.lineno}: not JSON: {json_msg(e)}") from None
    if not isinstance(config, dict):
        raise LoraError(f"{file}: not a JSON object")
    return config


def settings_from_peft_config(folder) -> LoraSettings:
    """The :class:`LoraSettings` of a PEFT adapter folder (:func:`pai_zoo.lora.settings.settings_from_peft_dict`)."""
    return settings_from_peft_dict(read_peft_config(folder), Path(folder) / PEFT_CONFIG)


class PeftAdapter(CheckpointReader):
    """A PEFT adapter folder as a reader (format ``"peft"``): :attr:`config` is its ``adapter_config.json``, the
    tensors its ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight`` ...)."""

    format = "peft"

    def __init__(self, path, iteration=None):
        from safetensors import SafetensorError, safe_open

        self.path = Path(path)
        self.config = read_peft_config(self.path)
        file = self.path / PEFT_WEIGHTS
        if not file.is_file():
            raise LoraError(f"{self.path}: no {PEFT_WEIGHTS}")
        try:
            self._file = safe_open(str(file), framework="pt")
        except (SafetensorError, OSError) as e:
            raise LoraError(f"{file}: not a safetensors file ({e})") from None

    def names(self) -> list[str]:
        return list(self._file.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(name).get_shape())

    def dtype(self, name: str):
        return self.read(name).dtype

    def read(self, name: str):
        return self._file.get_tensor(name)


def read_peft_adapter(folder, family=None) -> tuple[LoraSettings, dict]:
    """``(settings, {HF module: (A, B)})`` of a PEFT LoRA folder; a tensor pai-zoo cannot represent (embedding
    adapters, ``modules_to_save`` copies, a lone A or B, a rank other than the config's) is refused naming it.
    With ``family`` the modules are named as its checkpoint names them (:meth:`pai_zoo.Family.hf_checkpoint_name`),
    as the weight table does."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    settings = settings_from_peft_config(folder)
    file = folder / PEFT_WEIGHTS
    if not file.is_file():
        other = "adapter_model.bin" if (folder / "adapter_model.bin").is_file() else None
        raise LoraError(f"{folder}: no {PEFT_WEIGHTS}" + (f" ({other} is a pickle: re-save the adapter with "
                                                           "safe_serialization=True)" if other else ""))
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as e:
        raise LoraError(f"{file}: not a safetensors file ({e})") from None
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if not name.startswith(PREFIX) or suffix is None:
            raise LoraError(f"{file}: tensor {name} is not a LoRA A or B of a linear (pai-zoo reads "
                            f"{PREFIX}<module>.lora_A.weight / .lora_B.weight)")
        halves.setdefault(name[len(PREFIX): -len(suffix)], {})[suffix[1:7]] = tensor
    adapters = {}
    for module, pair in sorted(halves.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            lone = next(iter(pair))
            raise LoraError(f"{file}: {PREFIX}{module}.{lone}.weight has no "
                            f"{'lora_B' if lone == 'lora_A' else 'lora_A'} beside it")
        a, b = pair["lora_A"], pair["lora_B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != settings.rank or b.shape[1] != settings.rank:
            raise LoraError(f"{file}: {PREFIX}{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                            f"have rank r = {settings.rank} of {PEFT_CONFIG}")
        adapters[family.hf_checkpoint_name(module) if family is not None else module] = (a, b)
    if not adapters:
        raise LoraError(f"{file}: holds no adapters")
    return settings, adapters


class PeftAdapterWriter(FolderWriter):
    """A PEFT adapter folder staged beside ``dst`` and published whole by :meth:`close`: :meth:`write` each
    ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``; ``config`` is its ``adapter_config.json``. The
    tensors are kept until :meth:`close` (an adapter is small), which writes them as one safetensors file."""

    def __init__(self, dst, config: dict, *, force: bool = False):
        super().__init__(dst, force=force)
        self.config = dict(config)
        self.tensors: dict = {}

    def write(self, name: str, tensor) -> None:
        self.tensors[name] = tensor.contiguous()

    def finish(self) -> None:
        from safetensors.torch import save_file

        save_file(self.tensors, str(self.staging / PEFT_WEIGHTS), metadata={"format": "pt"})
        (self.staging / PEFT_CONFIG).write_text(json.dumps(self.config, indent=2) + "\n")


def write_peft_adapter(folder, settings: LoraSettings, adapters: dict, base: str | None, dtype=None,
                       family=None) -> None:
    """Write ``adapters`` (HF form) as a PEFT folder, complete or not at all (:class:`PeftAdapterWriter`, replacing
    a folder there); with ``family`` under its transformers model's module names
    (:meth:`pai_zoo.Family.hf_module_name`)."""
    leaves = sorted({m.rsplit(".", 1)[-1] for m in adapters})
    with PeftAdapterWriter(folder, peft_config(settings, leaves, base), force=True) as writer:
        for module, (a, b) in sorted(adapters.items()):
            module = family.hf_module_name(module) if family is not None else module
            writer.write(f"{PREFIX}{module}.lora_A.weight", a if dtype is None else a.to(dtype))
            writer.write(f"{PREFIX}{module}.lora_B.weight", b if dtype is None else b.to(dtype))
