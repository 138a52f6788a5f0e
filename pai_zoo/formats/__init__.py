"""Checkpoint formats on disk: one module per format, one function that opens any of them.

=====================  ============================================================  =========================
format                 what it is                                                    module
=====================  ============================================================  =========================
``hf``                 a Hugging Face folder (safetensors or pickle, with encodings)  :mod:`.hf_folder`
``mcore``              pai-zoo's Megatron-Core distributed checkpoint                :mod:`.mcore_dist`
``megatron-lm``        Megatron-LM's ``torch_dist`` checkpoint, with its args        :mod:`.mcore_dist`
``megatron-lm-legacy`` Megatron-LM's legacy ``torch`` files, with their args         :mod:`.megatron_legacy`
``peft``               a Hugging Face PEFT adapter folder                            :mod:`.peft_adapter`
``run``                a pai-zoo training-run folder (``train --save``)              :mod:`.training_run`
``lora-run``           a pai-zoo LoRA run folder (``train --peft lora --save``)      :mod:`.training_run`
``rl-run``             a pai-zoo RL run folder (``rl ... --save``: actor, critic)    :mod:`.training_run`
=====================  ============================================================  =========================

:func:`detect` says which format a path is in (its failure lists each format tried and why it did not fit);
:func:`open_checkpoint` opens it as a :class:`~.base.CheckpointReader`. Detection reads marker files only, here,
so that reading a format happens in its module alone. Weight encodings (FP8 blocks) are decoders
on the Hugging Face reader (:mod:`.encodings`): a reader hands out plain tensors. :mod:`.megatron_folder` holds
what the Megatron formats share (the tracker file, iteration folders, safe unpickling).
"""
from __future__ import annotations

import importlib
from pathlib import Path

from ..plugin.errors import no_such_path
from . import hf_folder, megatron_folder, peft_adapter, training_run
from .base import CheckpointReader, FolderWriter, UnknownFormatError

__all__ = ["FORMATS", "CheckpointReader", "FolderWriter", "UnknownFormatError", "detect", "open_checkpoint"]

#: Every format, in the order :func:`detect` tries them (the most specific first).
FORMATS = ("lora-run", "rl-run", "run", "peft", "mcore", "megatron-lm", "megatron-lm-legacy", "hf")
#: The formats whose model is a Megatron-Core checkpoint that pai-zoo wrote (read through its ``pai_zoo.json``).
PAI_ZOO_MCORE = ("mcore", "run")
#: The formats Megatron-LM wrote (read through their args).
MEGATRON_LM = ("megatron-lm", "megatron-lm-legacy")



def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def detect(path, *, iteration=None) -> str:
    """The format of the checkpoint at ``path`` (one of :data:`FORMATS`), from the files that mark each format;
    ``iteration`` picks a Megatron folder's saved iteration. A path no format fits is an :class:`UnknownFormatError`
    listing each format tried and why; a Megatron folder that cannot be read (a bad tracker, a missing iteration)
    raises its own error."""
    path = Path(path)
    if not path.exists():
        raise no_such_path(path, "the checkpoint")
    if not path.is_dir():
        raise UnknownFormatError(f"{path}: a file; a checkpoint is a folder (Hugging Face, Megatron-Core or "
                                 "Megatron-LM, PEFT adapter, pai-zoo run)")
    if (path / training_run.LORA_RECORD).is_file():
        return "lora-run"
    megatron = megatron_folder.is_megatron_folder(path)
    if not megatron and (path / training_run.RL_ROLES[0] / megatron_folder.TRACKER).is_file():
        return "rl-run"
    if (path / peft_adapter.PEFT_CONFIG).is_file():
        return "peft"
    if megatron:
        pai_zoo = (path / megatron_folder.PAI_ZOO_CONFIG).is_file()
        if pai_zoo and iteration is None:
            return "run" if (path / training_run.CONFIG_FILE).is_file() else "mcore"
        it = megatron_folder.iteration_folder(path, iteration)
        return "megatron-lm" if it.format == "torch_dist" else "megatron-lm-legacy"
    if (path / hf_folder.CONFIG).is_file():
        return "hf"
    raise UnknownFormatError(
        f"{path}: not a checkpoint folder pai-zoo reads; tried: pai-zoo run (no {training_run.LORA_RECORD}, "
        f"{'/'.join(training_run.RL_ROLES)}/ or {training_run.CONFIG_FILE}); PEFT adapter (no "
        f"{peft_adapter.PEFT_CONFIG}); Megatron-Core or Megatron-LM (no {megatron_folder.TRACKER}, "
        f"{megatron_folder.RELEASE}/ or iter_*/ folder); Hugging Face (no {hf_folder.CONFIG})")


def open_checkpoint(path, *, iteration=None, dtype=None, format: str | None = None) -> CheckpointReader:
    """The checkpoint at ``path`` as a reader of its format (``format``: what :func:`detect` said, when known).
    ``dtype`` is what a Hugging Face folder's quantized weights are decoded to; ``iteration`` a Megatron folder's
    saved iteration. A LoRA run reads as its adapters, an RL run as its actor."""
    path = Path(path)
    kind = format or detect(path, iteration=iteration)
    if kind == "hf":
        return hf_folder.open_weights(path, dtype)
    if kind == "peft":
        return peft_adapter.PeftAdapter(path)
    if kind == "rl-run":
        path = training_run.rl_model(path)
        kind = detect(path, iteration=iteration)
    it = megatron_folder.iteration_folder(path, iteration)
    if kind == "megatron-lm-legacy":
        return _module("megatron_legacy").LegacyCheckpoint(path, it)
    return _module("mcore_dist").McoreDistCheckpoint(path, it, kind)
