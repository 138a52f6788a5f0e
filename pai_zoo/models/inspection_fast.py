"""``inspect`` of a pai-zoo Megatron-Core checkpoint without torch or megatron-core: the same report as
:func:`pai_zoo.models.inspection._megatron` (which builds the model's layout on the meta device to count its
parameters), read from ``pai_zoo.json`` and the ``.metadata``'s global tensor shapes
(:func:`pai_zoo.formats.integrity.dist_tensor_shapes`).

The stored model tensors are exactly the layout's, with its global shapes (the slow path checks it:
``DistCheckpointReader.check_layout``), so the sum of their sizes is the model's parameter count. Only what this
answers exactly is answered: :func:`fast_megatron` returns ``None`` (the caller takes the slow path) for a
Megatron-LM folder, another ``--iteration`` than the tracker's, a score head, a config it cannot read, and MTP
experts it cannot count.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..families.registry import get_registry
from ..formats import PAI_ZOO_MCORE
from ..formats.hf_folder import tokenizer_files
from ..formats.integrity import dist_tensor_shapes
from ..formats.megatron_folder import HF_DIR, METADATA_FILE, PAI_ZOO_CONFIG, iteration_folder
from ..plugin.config_map import McoreConfig
from ..plugin.errors import PaiZooError
from .inspection_report import Inspection, _architecture, _vision_line

#: The stored keys of the model's tensors (``pai_zoo.formats.mcore_dist``'s: optimizer state and RNG left out).
MODEL_KEYS = ("embedding.", "decoder.", "output_layer.", "mtp.", "vision_model.")
_EXPERTS = ".experts.experts."  # a stored key of all experts of a layer: one local tensor per expert


def fast_megatron(path: Path, kind: str, family: str | None, tokenizer, iteration):
    """``(Inspection, fit)`` as :func:`pai_zoo.models.inspection._megatron` gives them, or ``None`` when only that
    can answer (see the module's docstring)."""
    if kind not in PAI_ZOO_MCORE or iteration is not None:
        return None
    try:
        record = json.loads((path / PAI_ZOO_CONFIG).read_text())
        if not isinstance(record, dict) or record.get("head") or not isinstance(record.get("mcore_config"), dict):
            return None
        config = McoreConfig(**record["mcore_config"])
        registry = get_registry()
        fam = registry.family(family) if family else registry.family(config.family)
        it = iteration_folder(path)
        if it.format != "torch_dist":
            return None
        shapes = {k: s for k, (s, _) in dist_tensor_shapes(it.folder / METADATA_FILE).items()
                  if k.startswith(MODEL_KEYS) and "/shard_" not in k}
        dtype = str(record.get("dtype", "float32"))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, PaiZooError):
        return None  # the slow path says what is wrong
    if "embedding.word_embeddings.weight" not in shapes or config.get("moe_grouped_gemm"):
        return None
    parameters = sum(math.prod(s) for s in shapes.values())
    layers = int(config.get("mtp_num_layers") or 0)
    mtp = None
    if layers:
        experts = int(config.get("num_moe_experts") or 0)
        count = 0
        for key, shape in shapes.items():
            if not key.startswith("mtp."):
                continue
            if _EXPERTS in key:
                if not experts or not shape or shape[0] != experts:
                    return None
                count += experts
            else:
                count += 1
        mtp = f"{layers} (mtp.layers.*: {count} tensors)"
    spec = fam.vision
    vision = None
    if spec is not None:
        vision = _vision_line(fam, sum(math.prod(s) for n, s in shapes.items() if n.startswith(spec.tower_prefix)),
                              sum(math.prod(s) for n, s in shapes.items()
                                  if spec.projector_prefix and n.startswith(spec.projector_prefix)))
    files = Path(tokenizer) if tokenizer else path / HF_DIR
    fit = None
    if files.is_dir() and tokenizer_files(files):
        fit = (files, fam, config["vocab_size"], files, False)
    shape = {"tensor_parallel": record.get("tensor_parallel"), "pipeline_parallel": record.get("pipeline_parallel")}
    return Inspection(path, "torch_dist (written by pai-zoo)", fam.name, parameters, dtype, None, shape,
                      _architecture(config.arch), [], mtp=mtp, vision=vision), fit
