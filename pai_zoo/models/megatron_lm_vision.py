"""Megatron-LM's Qwen3-VL checkpoints (``pretrain_qwenvl.py``'s ``Qwen3VLModel``) read as pai-zoo's qwen3_vl /
qwen3_vl_moe families (:mod:`pai_zoo.formats.megatron_lm_multimodal` describes the layout).

The language model is stored as a ``GPTModel`` under ``language_model.``: the checkpoint's reader is replaced by one
that strips that prefix (legacy ``torch``: before its index is built, so pipeline stages and Transformer Engine
names are read as in a GPT checkpoint; ``torch_dist``: on every key it looks up). The tower is transformers' own
``visual`` module under ``visual.visual.`` (transformers' names, replicated over tensor-parallel ranks): its tensors
are the Hugging Face model's ``model.visual.*``, turned into megatron-core's ``vision_model.*`` by the family's own
tower rows. The tower's settings are not in the args: the original Hugging Face folder (``--tokenizer HF_DIR``, or
``args.hf_model_name`` when it is such a folder) gives them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..families.registry import get_registry
from ..formats.hf_folder import is_hf_checkpoint
from ..formats.mcore_dist import DistCheckpointReader
from ..formats.megatron_folder import MegatronCheckpointError
from ..formats.megatron_legacy import LegacyReader
from ..formats.megatron_lm_multimodal import LANGUAGE_PREFIX, QWEN_VL_TOWER, multimodal_refusal
from ..tables.mapping import TO_MCORE, MappingContext

__all__ = ["open_qwen_vl", "qwen_vl_reference"]

#: transformers' name prefix of the Qwen3-VL tower.
HF_TOWER = "model.visual."


def qwen_vl_reference(checkpoint, reference) -> Path | None:
    """The HF folder that gives a Megatron-LM Qwen-VL checkpoint's tower settings, or a one-line refusal: the
    checkpoint must be of that layout (else :func:`multimodal_refusal`'s line)."""
    reader, args = checkpoint.reader, checkpoint.args
    refusal = multimodal_refusal(checkpoint.iteration.folder, reader.keys(), args)
    if refusal:
        raise MegatronCheckpointError(refusal)
    named = args.get("hf_model_name")
    folder = reference or (named if named and is_hf_checkpoint(named) else None)
    if folder is None or not is_hf_checkpoint(folder):
        raise MegatronCheckpointError(
            f"{checkpoint.iteration.folder}: a Megatron-LM Qwen-VL checkpoint keeps its tower's settings only in the "
            f"Hugging Face model its run named (args.hf_model_name={named!r}); pass that model's folder as "
            "--tokenizer HF_DIR")
    return Path(folder)


class _Tower:
    """The tower's megatron-core tensors, made once from the stored transformers tensors by the family's rows."""

    def __init__(self, hf: dict):
        self.hf, self.tensors = hf, None

    def build(self, family, config, padded_vocab_size: int, tower_prefix: str) -> dict:
        if self.tensors is None:
            table = get_registry().weight_map(family, config)
            ctx = MappingContext.from_config(config, padded_vocab_size=padded_vocab_size)
            steps, _ = table.plan(TO_MCORE, ctx)
            out, used = {}, set()
            for step in steps:
                if not all(t.startswith(tower_prefix) for t in step.targets):
                    continue
                missing = [s for s in step.sources if s not in self.hf]
                if missing:
                    raise MegatronCheckpointError(f"the checkpoint's tower lacks {QWEN_VL_TOWER}"
                                                  f"{missing[0][len(HF_TOWER):]} ({family.name}'s tower rows)")
                out.update(zip(step.targets, step.row.apply(TO_MCORE, [self.hf[s] for s in step.sources], ctx)))
                used.update(step.sources)
            extra = sorted(set(self.hf) - used)
            if extra:
                raise MegatronCheckpointError(f"the checkpoint's tower holds {QWEN_VL_TOWER}{extra[0][len(HF_TOWER):]}"
                                              f", which the {family.name} family's tower has no row for")
            self.tensors = out
        return self.tensors


class _VisionReader:
    """The language model's tensors as the GPT reader gives them, and the tower's (:class:`_Tower`)."""

    tower: _Tower
    _built: dict | None = None
    _checking = False  # the language model's check: the stored keys without the tower's

    def use_family(self, family, config, padded_vocab_size: int) -> None:
        self._built = self.tower.build(family, config, padded_vocab_size, family.vision.tower_prefix)

    def _is_tower(self, name: str) -> bool:
        return self._built is not None and name in self._built

    def keys(self) -> list[str]:
        return [*super().keys(), *((self._built or {}) if not self._checking else ())]

    def global_shape(self, name):
        return tuple(self._built[name].shape) if self._is_tower(name) else super().global_shape(name)

    def dtype(self, name):
        return self._built[name].dtype if self._is_tower(name) else super().dtype(name)

    def check_layout(self, layout, family: str) -> None:
        tower = {n for n in layout.local_shapes if self._is_tower(n)}
        for name in tower:
            if tuple(self._built[name].shape) != tuple(layout.local_shapes[name]):
                raise MegatronCheckpointError(f"tower tensor {name} has shape {tuple(self._built[name].shape)}, "
                                              f"the model needs {tuple(layout.local_shapes[name])}")
        missing = sorted(set(self._built or {}) - set(layout.local_shapes))
        if missing:
            raise MegatronCheckpointError(f"the {family} model has no tower tensor {missing[0]}")
        self._checking = True
        try:
            super().check_layout(_without(layout, tower), family)
        finally:
            self._checking = False

    def read_local(self, layout, name: str):
        return self._built[name].to(layout.dtype).clone() if self._is_tower(name) else super().read_local(layout,
                                                                                                            name)


def _without(layout, names: set):
    chunks = [c for c in layout.chunks if c.local_name not in names]
    return replace(layout, chunks=chunks, local_shapes={k: v for k, v in layout.local_shapes.items() if k not in names},
                   by_local={})


class _LegacyVisionReader(_VisionReader, LegacyReader):
    def __init__(self, it, args):
        self.tower = _Tower({})
        super().__init__(it, args)

    def _model_chunks(self, state: dict, file: Path) -> list[dict]:
        out = []
        for chunk in LegacyReader._model_chunks(state, file):
            for key, value in chunk.items():
                if key.startswith(QWEN_VL_TOWER) and not key.endswith("_extra_state") and value is not None:
                    self.tower.hf.setdefault(HF_TOWER + key[len(QWEN_VL_TOWER):], value)
            out.append({k[len(LANGUAGE_PREFIX):]: v for k, v in chunk.items() if k.startswith(LANGUAGE_PREFIX)})
        return out


class _DistVisionReader(_VisionReader, DistCheckpointReader):
    def __init__(self, folder):
        super().__init__(folder)
        stored = self.metadata.state_dict_metadata
        self.tower, self._stored = _Tower({}), set()
        for key, md in stored.items():
            if key.startswith(QWEN_VL_TOWER) and hasattr(md, "size") and not key.endswith("_extra_state"):
                self.tower.hf[HF_TOWER + key[len(QWEN_VL_TOWER):]] = DistCheckpointReader.read(
                    self, key, (0,) * len(md.size), tuple(md.size))
        self.metadata.state_dict_metadata = {k[len(LANGUAGE_PREFIX):]: v for k, v in stored.items()
                                             if k.startswith(LANGUAGE_PREFIX)}
        self._stored = {k[len(LANGUAGE_PREFIX):] for k in stored if k.startswith(LANGUAGE_PREFIX)}

    def _load_chunk(self, key: str, offsets) -> torch.Tensor:
        return super()._load_chunk(LANGUAGE_PREFIX + key if key in self._stored else key, offsets)


def open_qwen_vl(checkpoint, reference):
    """Give ``checkpoint`` (a Megatron-LM folder's format reader whose tensors are ``language_model.*``) a reader of
    the Qwen-VL layout; returns the reference HF folder. Refuses in one line what it cannot read."""
    folder = qwen_vl_reference(checkpoint, reference)
    checkpoint.reader.close()
    if isinstance(checkpoint.reader, LegacyReader):
        checkpoint.reader = _LegacyVisionReader(checkpoint.iteration, checkpoint.args)
    else:
        checkpoint.reader = _DistVisionReader(checkpoint.iteration.folder)
    return folder
