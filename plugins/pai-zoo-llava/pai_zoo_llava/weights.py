"""LLaVA-OneVision's weight table, under the names transformers 5 saves (``language_model.model.*``,
``language_model.lm_head.weight``, ``vision_tower.*``, ``multi_modal_projector.*``, ``image_newline``):

* the language model: Qwen2's table (:func:`pai_zoo_qwen.qwen2_weights`, QKV bias) under ``language_model.``;
* the SigLIP tower: the core's rows (:func:`pai_zoo.tables.mapping.siglip_rows.siglip_rows`) into
  ``vision_model.siglip.``, every layer and ``post_layernorm`` included (the model reads ``vision_feature_layer``'s
  hidden state, but the checkpoint holds them all);
* the projector ``multi_modal_projector.linear_{1,2}`` -> ``vision_model.projector.linear_{1,2}`` and
  ``image_newline`` -> ``vision_model.image_newline.weight``, replicated under tensor parallelism.
"""
from __future__ import annotations

import copy

from pai_zoo import Copy, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.tables.mapping.siglip_rows import siglip_rows
from pai_zoo.vision import VISION_KEY
from pai_zoo_qwen import qwen2_weights

from .config import llava_settings

LM = "language_model."
MV = "vision_model."


def _under(row, prefix: str):
    """``row`` with its transformers names under ``prefix``."""
    row = copy.copy(row)
    row.hf = tuple(prefix + name for name in row.hf)
    return row


def llava_weights(config: McoreConfig) -> WeightMap:
    """The whole table (see the module docstring)."""
    s = llava_settings(config)
    rows = [_under(row, LM) for row in qwen2_weights(config).rows]
    rows += siglip_rows(config[VISION_KEY], "vision_tower.", MV + "siglip.")
    params = ("weight", "bias") if s["multimodal_projector_bias"] else ("weight",)
    rows += [Copy(f"multi_modal_projector.linear_{i}.{p}", f"{MV}projector.linear_{i}.{p}")
             for i in (1, 2) for p in params]
    rows.append(Copy("image_newline", MV + "image_newline.weight"))
    return WeightMap(*rows)
