"""``inspect`` of a Megatron-Core ``torch_dist`` checkpoint without torch or megatron-core: the same report as
:func:`pai_zoo.models.inspection._megatron` (which builds the model's layout on the meta device to count its
parameters), read from the ``.metadata``'s global tensor shapes (:func:`pai_zoo.formats.integrity.dist_tensor_shapes`)
and pai-zoo's ``pai_zoo.json`` or Megatron-LM's ``args`` (``common.pt``, or the ``common_state`` entry, read by
:func:`pai_zoo.formats.integrity.read_torch_pickle`).

The stored model tensors are exactly the layout's, with its global shapes (the slow path checks it:
``DistCheckpointReader.check_layout``), so the sum of their sizes is the model's parameter count. Only what this
answers exactly is answered: :func:`fast_megatron` returns ``None`` (the caller takes the slow path) for a legacy
``torch`` folder of more than one tensor- or expert-parallel rank (only the layout tells a shard from a copy there),
or with virtual pipeline stages, a score head, args or a config it cannot read without torch, and MTP experts it
cannot count. A legacy folder's parameters are its stages' tensors (TE's fused norm names are one tensor as the local
ones; a ``GroupedMLP`` tensor holds all experts), less the tied output layer's copy.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..families.registry import get_registry
from ..formats import PAI_ZOO_MCORE
from ..formats.hf_folder import tokenizer_files
from ..formats.integrity import StandIn, dist_bytes_entry, dist_tensor_shapes, read_torch_pickle
from ..formats.megatron_folder import (
    COMMON_FILE,
    COMMON_STATE_KEY,
    HF_DIR,
    LEGACY_FILE,
    METADATA_FILE,
    PAI_ZOO_CONFIG,
    RANK_DIR,
    checkpoint_args,
    iteration_folder,
)
from ..plugin.config_map import McoreConfig
from ..tables.layer_kinds import layers_line
from .inspection_report import Inspection, _architecture, _vision_line
from .megatron_lm_config import derive_config

#: The stored keys of the model's tensors (``pai_zoo.formats.mcore_dist``'s: optimizer state and RNG left out).
MODEL_KEYS = ("embedding.", "decoder.", "output_layer.", "mtp.", "vision_model.")
EMBEDDING = "embedding.word_embeddings.weight"
_EXPERTS = ".experts.experts."  # a stored key of all experts of a layer: one local tensor per expert


def _model_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    return {k: s for k, (s, _) in dist_tensor_shapes(folder / METADATA_FILE).items()
            if k.startswith(MODEL_KEYS) and "/shard_" not in k}


def _mtp_line(config, shapes: dict) -> str | None:
    """The MTP line as the layout counts its tensors (one per expert), or ``""`` when it cannot tell."""
    layers = int(config.get("mtp_num_layers") or 0)
    if not layers:
        return None
    experts = int(config.get("num_moe_experts") or 0)
    count = 0
    for key, shape in shapes.items():
        if not key.startswith("mtp."):
            continue
        if _EXPERTS in key:
            if not experts or not shape or shape[0] != experts:
                return ""
            count += experts
        else:
            count += 1
    return f"{layers} (mtp.layers.*: {count} tensors)"


def _common_args(it) -> dict | None:
    """A Megatron-LM ``torch_dist`` iteration's args, read without torch (``None``: only torch can tell)."""
    if (it.folder / COMMON_FILE).is_file():
        common = read_torch_pickle(it.folder / COMMON_FILE)
    else:
        data = dist_bytes_entry(it.folder, COMMON_STATE_KEY)
        if data is None:
            return None
        common = read_torch_pickle(data)
        common = common[0] if isinstance(common, list) else common
    if not isinstance(common, dict) or not isinstance(common.get("args"), (argparse.Namespace, dict)):
        return None
    return checkpoint_args(it, common)


def fast_megatron(path: Path, kind: str, family: str | None, tokenizer, iteration):
    """``(Inspection, fit)`` as :func:`pai_zoo.models.inspection._megatron` gives them, or ``None`` when only that
    can answer (see the module's docstring)."""
    try:
        if kind in PAI_ZOO_MCORE and iteration is None:
            return _pai_zoo(path, family, tokenizer)
        return _megatron_lm(path, family, tokenizer, iteration)
    except Exception:  # noqa: BLE001 - whatever it cannot read, the slow path reads or says what is wrong
        return None


def _pai_zoo(path: Path, family: str | None, tokenizer):
    record = json.loads((path / PAI_ZOO_CONFIG).read_text())
    if not isinstance(record, dict) or record.get("head") or not isinstance(record.get("mcore_config"), dict):
        return None
    config = McoreConfig(**record["mcore_config"])
    registry = get_registry()
    fam = registry.family(family) if family else registry.family(config.family)
    it = iteration_folder(path)
    if it.format != "torch_dist":
        return None
    shapes = _model_shapes(it.folder)
    mtp = _mtp_line(config, shapes)
    if EMBEDDING not in shapes or config.get("moe_grouped_gemm") or mtp == "":
        return None
    files = Path(tokenizer) if tokenizer else path / HF_DIR
    fit = (files, fam, config["vocab_size"], files, False) if files.is_dir() and tokenizer_files(files) else None
    shape = {"tensor_parallel": record.get("tensor_parallel"), "pipeline_parallel": record.get("pipeline_parallel")}
    return Inspection(path, "torch_dist (written by pai-zoo)", fam.name, sum(math.prod(s) for s in shapes.values()),
                      str(record.get("dtype", "float32")), None, shape, _architecture(config.arch), [], mtp=mtp,
                      vision=_vision(fam, shapes), layers=layers_line(config.arch)), fit


def _megatron_lm(path: Path, family: str | None, tokenizer, iteration):
    """A ``torch_dist`` folder read from its args, as :func:`pai_zoo.models.megatron_checkpoint.describe` does."""
    it = iteration_folder(path, iteration)
    if it.format == "torch_dist":
        shapes = dist_tensor_shapes(it.folder / METADATA_FILE)
        if EMBEDDING not in shapes:
            return None
        (padded, *_), dtype = shapes[EMBEDDING]
        args = _common_args(it)
        model = _model_shapes(it.folder)
    else:
        read = _legacy(it)
        if read is None:
            return None
        args, model, dtype = read
        padded = model[EMBEDDING][0]
    if args is None:
        return None
    derived = derive_config(args, str(it.folder), family=family, reference=tokenizer, padded_vocab_size=padded)
    config = derived.config
    if any(isinstance(v, StandIn) for v in config.arch.values()) or config.get("moe_grouped_gemm"):
        return None  # a value only torch or megatron-core builds
    if it.format != "torch_dist":
        if derived.family.vision is not None:
            return None
        if config.get("share_embeddings_and_output_weights"):  # the last pipeline stage's copy is no parameter
            model.pop("output_layer.weight", None)
        layers = int(config.get("mtp_num_layers") or 0)
        mtp = f"{layers} (mtp.layers.*: {sum(1 for n in model if n.startswith('mtp.'))} tensors)" if layers else None
    else:
        mtp = _mtp_line(config, model)
    if mtp == "":
        return None
    needs = [n.removeprefix("note: ") for n in derived.notes]
    if tokenizer is None and derived.reference is None:
        needs.append("the checkpoint records no tokenizer folder: pass --tokenizer DIR (the original HF folder) "
                     "to copy its tokenizer and take the fields Megatron does not store")
    files = Path(tokenizer) if tokenizer else derived.reference
    fit = None
    if files is not None and Path(files).is_dir() and tokenizer_files(files):
        fit = (Path(files), derived.family, config["vocab_size"], Path(files), True)
    shape = {"tensor_parallel": int(args.get("tensor_model_parallel_size") or 1),
             "pipeline_parallel": int(args.get("pipeline_model_parallel_size") or 1),
             "virtual_pipeline": args.get("virtual_pipeline_model_parallel_size"),
             "expert_parallel": int(args.get("expert_model_parallel_size") or 1)}
    fmt = f"{it.format} (written by Megatron-LM: no pai_zoo.json, read from its args)"
    return Inspection(path, fmt, derived.family.name, sum(math.prod(s) for s in model.values()), dtype,
                      it.iteration, shape, _architecture(config.arch), needs, mtp=mtp,
                      vision=_vision(derived.family, model), layers=layers_line(config.arch)), fit


def _legacy(it):
    """``(args, {name: shape}, dtype)`` of a legacy folder of one tensor- and expert-parallel rank (its pipeline
    stages' files, read without torch), or ``None``: with more ranks only the layout tells a tensor-parallel shard
    from a copy."""
    ranks = sorted(p for p in it.folder.iterdir() if RANK_DIR.match(p.name) and (p / LEGACY_FILE).is_file())
    first = read_torch_pickle(ranks[0] / LEGACY_FILE)  # where the slow path reads the args
    if not isinstance(first, dict) or not isinstance(first.get("args"), (argparse.Namespace, dict)):
        return None
    args = checkpoint_args(it, {k: v for k, v in first.items() if k not in ("model", "optimizer", "rng_state")
                                and not k.startswith("model")})
    size = {k: int(args.get(f"{k}_model_parallel_size") or 1) for k in ("tensor", "pipeline", "expert")}
    if size["tensor"] != 1 or size["expert"] != 1 or args.get("virtual_pipeline_model_parallel_size") or (
            ranks[0].name != _rank_dir(0, size["pipeline"])):
        return None
    pp, shapes, dtype = size["pipeline"], {}, None
    layers = 0
    for stage in range(pp):
        state = first if stage == 0 else read_torch_pickle(it.folder / _rank_dir(stage, pp) / LEGACY_FILE)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict):
            return None
        held = set()
        for key, value in model.items():
            if key.endswith("_extra_state") or value is None:
                continue
            if not isinstance(value, StandIn) or value.shape is None:
                return None
            parts = key.split(".")
            if key.startswith("decoder.layers.") and parts[2].isdigit():  # each stage numbers its layers from 0
                held.add(int(parts[2]))
                key = ".".join([*parts[:2], str(int(parts[2]) + layers), *parts[3:]])
            elif stage and key != "output_layer.weight" and not key.startswith(("decoder.final_", "mtp.")):
                return None
            if key in shapes:
                return None
            shapes[key] = value.shape
            if key == EMBEDDING:
                dtype = value.dtype
        layers += len(held)
    if EMBEDDING not in shapes or dtype is None:
        return None
    return args, shapes, dtype


def _rank_dir(stage: int, stages: int) -> str:
    return "mp_rank_00" + (f"_{stage:03d}" if stages > 1 else "")


def _vision(fam, shapes: dict) -> str | None:
    spec = fam.vision
    if spec is None:
        return None
    return _vision_line(fam, sum(math.prod(s) for n, s in shapes.items() if n.startswith(spec.tower_prefix)),
                        sum(math.prod(s) for n, s in shapes.items()
                            if spec.projector_prefix and n.startswith(spec.projector_prefix)))
