"""Megatron-LM's multimodal checkpoints: recognized from their tensor names and ``args``, and refused in one line that
says which model they hold and what pai-zoo would need to read them.

Megatron-LM writes two vision-language layouts, both with the language model (a ``GPTModel``) under
``language_model.``:

- ``pretrain_qwenvl.py`` (``megatron/core/models/multimodal/qwen3_vl_model.py``, ``Qwen3VLModel``,
  ``--vision-model-type qwen3_vl --hf-model-name ...``): the tower is transformers' own Qwen3-VL ``visual`` module,
  stored under transformers' names as ``visual.visual.*`` (replicated on every tensor-parallel rank); its settings
  are not in the args but in the Hugging Face model the run named. Megatron-LM has no Qwen2-VL or Qwen2.5-VL model.
- ``examples/multimodal`` / ``pretrain_vlm.py`` (``LLaVAModel``, ``--vision-model-type clip|siglip|internvit|
  radio|...``): a CLIP/SigLIP/InternViT/RADIO tower under ``vision_model.`` and an MLP under
  ``vision_projection.``: no Qwen-VL model whatever language model it has.

pai-zoo reads the Qwen3-VL one (:mod:`pai_zoo.models.megatron_lm_vision`); :func:`multimodal_refusal` gives the
one-line refusal of any other (the LLaVA layout, a Qwen-VL one without its tower or its args).
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["LANGUAGE_PREFIX", "QWEN_VL_TYPES", "multimodal_refusal"]

#: Where Megatron-LM's multimodal models keep their language model.
LANGUAGE_PREFIX = "language_model."
#: ``args.vision_model_type`` values that name a Qwen-VL model, and the pai-zoo families of that model.
QWEN_VL_TYPES = {"qwen3_vl": ("qwen3_vl", "qwen3_vl_moe")}
#: The tower prefixes of the two layouts.
QWEN_VL_TOWER, LLAVA_TOWER, LLAVA_PROJECTION = "visual.visual.", "vision_model.", "vision_projection."


def multimodal_refusal(folder, keys: Iterable[str], args: dict) -> str | None:
    """The one-line refusal for a Megatron-LM multimodal checkpoint at ``folder`` (its stored tensor ``keys`` and
    ``args``) that pai-zoo cannot read, or None: not a multimodal one (no ``language_model.`` tensors), or a whole
    Qwen3-VL one, which is read."""
    keys = list(keys)
    if not any(k.startswith(LANGUAGE_PREFIX) for k in keys):
        return None
    kind = args.get("vision_model_type")
    towers = sorted({p for p in (QWEN_VL_TOWER, LLAVA_TOWER, LLAVA_PROJECTION) if any(k.startswith(p) for k in keys)})
    held = f"language_model.*{''.join(f', {p}*' for p in towers)}"
    if kind in QWEN_VL_TYPES or QWEN_VL_TOWER in towers:  # read by pai_zoo.models.megatron_lm_vision when whole
        if QWEN_VL_TOWER in towers and kind in QWEN_VL_TYPES:
            return None
        missing = "its tower (visual.visual.*)" if QWEN_VL_TOWER not in towers else \
            f"args.vision_model_type naming it ({', '.join(QWEN_VL_TYPES)})"
        return (f"{folder}: a Megatron-LM Qwen-VL checkpoint (args.vision_model_type={kind!r}: {held}) without "
                f"{missing} is not read")
    if kind is None:
        return (f"{folder}: a Megatron-LM multimodal checkpoint ({held}) without args.vision_model_type is not read: "
                "pai-zoo reads Megatron-LM's GPT checkpoints only")
    return (f"{folder}: a Megatron-LM LLaVA checkpoint (args.vision_model_type={kind!r}: {held}) is not read: its "
            f"{kind} tower is no Qwen-VL model and pai-zoo has no family for Megatron-LM's LLaVAModel")
