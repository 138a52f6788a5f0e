"""Kimi-K2's transformers config without remote code (imports transformers; named by the family's ``LazyClass``).

Kimi-K2 is DeepSeek-V3's architecture (``DeepseekV3ForCausalLM``) under ``model_type: kimi_k2``, which
transformers does not know: :class:`KimiK2Config` is transformers' ``DeepseekV3Config`` that writes
``model_type: kimi_k2`` back, and the model is transformers' own ``DeepseekV3ForCausalLM``. transformers finds
the renaming between its fused experts and the checkpoint's per-expert tensors by model type: importing this module
registers DeepSeek-V3's for ``kimi_k2``.
"""
from __future__ import annotations

from transformers import DeepseekV3Config
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping

__all__ = ["KimiK2Config"]

MODEL_TYPE = "kimi_k2"

if get_checkpoint_conversion_mapping(MODEL_TYPE) is None:
    register_checkpoint_conversion_mapping(MODEL_TYPE, get_checkpoint_conversion_mapping("deepseek_v3"))


class KimiK2Config(DeepseekV3Config):
    """transformers' ``DeepseekV3Config`` with ``model_type`` ``kimi_k2``."""

    model_type = MODEL_TYPE
