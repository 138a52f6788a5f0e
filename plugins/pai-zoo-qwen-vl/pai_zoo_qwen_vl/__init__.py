"""pai-zoo plugin for Qwen's vision-language models: two families.

* ``qwen2-vl``   - Qwen2-VL, transformers' ``Qwen2VLForConditionalGeneration``: a ViT with LayerNorm and full
  attention, a 2 x 2 patch merger, Qwen2's language model with M-RoPE.
* ``qwen2.5-vl`` - Qwen2.5-VL, ``Qwen2_5_VLForConditionalGeneration``: the tower with RMSNorm, SwiGLU and window
  attention (``fullatt_block_indexes`` attend over the whole image), video time in the M-RoPE ids.

* ``qwen3_vl``, ``qwen3_vl_moe`` - Qwen3-VL and its MoE (:mod:`pai_zoo_qwen_vl.qwen3_vl`): DeepStack, interleaved
  M-RoPE, learned tower positions, video frames as vision blocks of their own.

The language model is megatron-core's ``GPTModel`` (``position_embedding_type="mrope"``); the tower is
:class:`pai_zoo_qwen_vl.vision.QwenVisionTower` on the first pipeline stage (:mod:`pai_zoo.mcore.multimodal`).
"""
from __future__ import annotations

from pai_zoo import hookimpl
from pai_zoo.vision import VisionSpec

from .config import VisionLanguageConfig, placeholder_ids, qwen_vl_family, token_key, tower_parameters
from .presets import QWEN2_5_VL_PRESETS, QWEN2_VL_PRESETS
from .processor_files import write_test_tokenizer
from .weights import qwen_vl_weights


def _tower(config, lm_config):
    from .vision import build_tower

    return build_tower(config, lm_config)


def _positions(config, input_ids, attention_mask=None, image_grid_thw=None, video_grid_thw=None,
               second_per_grid_ts=None):
    from .config import tower_settings
    from .positions import mrope_positions

    s = tower_settings(config)
    return mrope_positions(
        input_ids, attention_mask, image_grid_thw, video_grid_thw,
        image_token_id=config[token_key("image_token_id")], video_token_id=config[token_key("video_token_id")],
        spatial_merge_size=s["merge"], tokens_per_second=s["tokens_per_second"],
        second_per_grid_ts=second_per_grid_ts,
    )


def _example(config, generator) -> dict:
    from .config import tower_settings
    from .positions import example_inputs

    s = tower_settings(config)
    return example_inputs(
        config, generator, image_token_id=config[token_key("image_token_id")],
        video_token_id=config[token_key("video_token_id")], start=config[token_key("vision_start_token_id")],
        end=config[token_key("vision_end_token_id")], merge=s["merge"],
        patch_values=s["channels"] * s["temporal"] * s["patch"] ** 2,
    )


def _tokens(config, grid) -> int:
    from .config import tower_settings

    t, h, w = (int(v) for v in grid)
    return t * h * w // tower_settings(config)["merge"] ** 2


QWEN_VL_VISION = VisionSpec(tower=_tower, placeholders=placeholder_ids, positions=_positions, tokens=_tokens,
                            example=_example, projector_prefix="vision_model.merger.",
                            parameters=tower_parameters)

#: transformers 5 holds the language model and the tower under model.language_model. / model.visual. in memory and
#: saves them as the published checkpoints name them (model., visual.); lm_head is the same in both.
MODULE_PREFIXES = (("model.", "model.language_model."), ("visual.", "model.visual."))

def _family(name: str, aliases: tuple, architecture: str, model_type: str, presets: dict, description: str):
    """One Qwen-VL family: the nested config, the table, transformers' class, the tower, the test tokenizer."""
    return qwen_vl_family(name, aliases, architecture, model_type, presets, description,
                          config_map=VisionLanguageConfig(f"{model_type}_text", f"{model_type}_vision"),
                          weight_map=qwen_vl_weights, test_tokenizer=write_test_tokenizer, vision=QWEN_VL_VISION,
                          hf_module_prefixes=MODULE_PREFIXES)


QWEN2_VL = _family("qwen2-vl", ("qwen2_vl",), "Qwen2VLForConditionalGeneration", "qwen2_vl", QWEN2_VL_PRESETS,
                   "Qwen2-VL (Qwen2VLForConditionalGeneration): images and video, M-RoPE")
QWEN2_5_VL = _family("qwen2.5-vl", ("qwen2_5_vl", "qwen2_5-vl"), "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl",
                     QWEN2_5_VL_PRESETS, "Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): window-attention tower, "
                     "video time in M-RoPE")


@hookimpl
def pai_zoo_families():
    from .qwen3_vl import QWEN3_VL, QWEN3_VL_MOE

    return [QWEN2_VL, QWEN2_5_VL, QWEN3_VL, QWEN3_VL_MOE]
