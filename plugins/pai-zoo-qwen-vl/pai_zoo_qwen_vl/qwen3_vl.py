"""The Qwen3-VL families: ``qwen3_vl`` (``Qwen3VLForConditionalGeneration``) and ``qwen3_vl_moe``
(``Qwen3VLMoeForConditionalGeneration``).

Qwen3's language model (q/k norms; Qwen3-MoE's experts for the MoE one) on megatron-core's ``GPTModel`` with
interleaved M-RoPE (:mod:`pai_zoo.mcore.mrope`), the Qwen3-VL tower (:mod:`pai_zoo_qwen_vl.qwen3_vision`) on the
first pipeline stage, and DeepStack (:attr:`pai_zoo.vision.VisionSpec.deepstack`, :mod:`pai_zoo.mcore.deepstack`):
the tower's DeepStack features are added after the first language-model layers. Video frames are vision blocks of
their own, their timestamps text (:mod:`pai_zoo_qwen_vl.qwen3_positions`).
"""
from __future__ import annotations

from pai_zoo.vision import VisionSpec

from .config import placeholder_ids, qwen_vl_family, token_key
from .processor_files import write_qwen3_vl_test_tokenizer
from .qwen3_config import (
    QWEN3_VL_MOE_TEXT_CONFIG,
    QWEN3_VL_TEXT_CONFIG,
    Qwen3VisionLanguageConfig,
    qwen3_tower_parameters,
    qwen3_tower_settings,
)
from .qwen3_presets import QWEN3_VL_MOE_PRESETS, QWEN3_VL_PRESETS
from .qwen3_weights import qwen3_vl_moe_weights, qwen3_vl_weights


def _tower(config, lm_config):
    from .qwen3_vision import build_qwen3_tower

    return build_qwen3_tower(config, lm_config)


def _positions(config, input_ids, attention_mask=None, image_grid_thw=None, video_grid_thw=None,
               second_per_grid_ts=None):
    from .qwen3_positions import qwen3_mrope_positions

    return qwen3_mrope_positions(input_ids, attention_mask, image_grid_thw, video_grid_thw,
                                 image_token_id=config[token_key("image_token_id")],
                                 video_token_id=config[token_key("video_token_id")],
                                 spatial_merge_size=qwen3_tower_settings(config)["merge"])


def _example(config, generator) -> dict:
    from .qwen3_positions import qwen3_example_inputs

    s = qwen3_tower_settings(config)
    return qwen3_example_inputs(
        config, generator, image_token_id=config[token_key("image_token_id")],
        video_token_id=config[token_key("video_token_id")], start=config[token_key("vision_start_token_id")],
        end=config[token_key("vision_end_token_id")], merge=s["merge"],
        patch_values=s["channels"] * s["temporal"] * s["patch"] ** 2)


def _tokens(config, grid) -> int:
    t, h, w = (int(v) for v in grid)
    return t * h * w // qwen3_tower_settings(config)["merge"] ** 2


def _deepstack(config) -> tuple[int, ...]:
    return qwen3_tower_settings(config)["deepstack"]


QWEN3_VL_VISION = VisionSpec(tower=_tower, placeholders=placeholder_ids, positions=_positions, tokens=_tokens,
                             example=_example, projector_prefix="vision_model.merger.",
                             parameters=qwen3_tower_parameters, deepstack=_deepstack)

#: No Megatron-LM args claim: a text checkpoint's args are Qwen3's or Qwen3-MoE's (those families claim them);
#: Megatron-LM's own Qwen3-VL checkpoints are told by args.vision_model_type (pai_zoo.models.megatron_lm_vision).

def _family(name, aliases, architecture, model_type, presets, config_map, weights, megatron_args, description):
    return qwen_vl_family(name, aliases, architecture, model_type, presets, description,
                          config_map=Qwen3VisionLanguageConfig(f"{model_type}_text", f"{model_type}_vision",
                                                               config_map),
                          weight_map=weights, test_tokenizer=write_qwen3_vl_test_tokenizer, vision=QWEN3_VL_VISION,
                          megatron_args=megatron_args)


QWEN3_VL = _family("qwen3_vl", ("qwen3-vl",), "Qwen3VLForConditionalGeneration", "qwen3_vl", QWEN3_VL_PRESETS,
                   QWEN3_VL_TEXT_CONFIG, qwen3_vl_weights, (),
                   "Qwen3-VL (Qwen3VLForConditionalGeneration): DeepStack, interleaved M-RoPE, timestamped video")
QWEN3_VL_MOE = _family("qwen3_vl_moe", ("qwen3-vl-moe",), "Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe",
                       QWEN3_VL_MOE_PRESETS, QWEN3_VL_MOE_TEXT_CONFIG, qwen3_vl_moe_weights, (),
                       "Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration): Qwen3-VL on a Qwen3-MoE language model")
