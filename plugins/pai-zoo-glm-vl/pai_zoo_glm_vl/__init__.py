"""pai-zoo plugin for GLM's vision-language models: two families.

* ``glm4v``     - GLM-4.1V, transformers' ``Glm4vForConditionalGeneration``: GLM-4-0414's language model (post
  norms) with M-RoPE on interleaved channel pairs of half of each head (:mod:`pai_zoo.mcore.mrope_pairs`).
* ``glm4v_moe`` - GLM-4.5V, ``Glm4vMoeForConditionalGeneration``: GLM-4.5's mixture of experts (sigmoid router
  with the score-correction bias, shared experts, first-k dense layers; EP as for the text MoE families), M-RoPE on
  halves (megatron-core's own ``mrope`` with ``rotary_percent``).

Both have the GLM-4V tower (:mod:`pai_zoo_glm_vl.vision`) on the first pipeline stage (:mod:`pai_zoo.mcore.multimodal`)
and GLM-4V's positions (:mod:`pai_zoo_glm_vl.positions`): a video's frames are runs of the image placeholder between
``<|begin_of_video|>`` and ``<|end_of_video|>``, each with its timestamp as text, as the processor writes them.
"""
from __future__ import annotations

from pai_zoo import Family, hookimpl
from pai_zoo.family import LazyClass
from pai_zoo.vision import VisionSpec

from .config import GLM4V_CONFIG, GLM4V_MOE_CONFIG, token_key, tower_parameters
from .presets import GLM4V_MOE_PRESETS, GLM4V_PRESETS
from .processor_files import write_test_tokenizer
from .weights import glm4v_moe_weights, glm4v_weights


def _tower(config, lm_config):
    from .vision import build_tower

    return build_tower(config, lm_config)


def _placeholders(config) -> dict[str, int]:
    """GLM-4V writes a video's frames with the image placeholder."""
    image = config[token_key("image_token_id")]
    return {"image": image, "video": image}


def _positions(config, input_ids, attention_mask=None, image_grid_thw=None, video_grid_thw=None,
               second_per_grid_ts=None):
    from .config import tower_settings
    from .positions import glm_positions

    return glm_positions(input_ids, attention_mask, image_grid_thw, video_grid_thw,
                         image_token_id=config[token_key("image_token_id")],
                         video_start_id=config[token_key("video_start_token_id")],
                         video_end_id=config[token_key("video_end_token_id")], merge=tower_settings(config)["merge"])


def _hf_inputs(config, input_ids) -> dict:
    """transformers' ``mm_token_type_ids`` as GLM-4V's processor makes them (video frames inside the video tokens)."""
    from .positions import token_types

    return {"mm_token_type_ids": token_types(input_ids, config[token_key("image_token_id")],
                                             config[token_key("video_start_token_id")],
                                             config[token_key("video_end_token_id")])}


def _example(config, generator) -> dict:
    from .config import tower_settings
    from .positions import example_inputs

    s = tower_settings(config)
    return example_inputs(config, generator, image_token_id=config[token_key("image_token_id")],
                          start=config[token_key("image_start_token_id")],
                          end=config[token_key("image_end_token_id")], text_below=400, merge=s["merge"],
                          patch_values=s["channels"] * s["temporal"] * s["patch"] ** 2)


def _tokens(config, grid) -> int:
    from .config import tower_settings

    t, h, w = (int(v) for v in grid)
    return t * h * w // tower_settings(config)["merge"] ** 2


GLM_VISION = VisionSpec(tower=_tower, placeholders=_placeholders, positions=_positions, tokens=_tokens,
                        example=_example, projector_prefix="vision_model.merger.", parameters=tower_parameters,
                        hf_inputs=_hf_inputs)


def _glm4v_layer_spec(config):
    from pai_zoo_glm import layer_spec

    return layer_spec(config)  # megatron-core's local spec with the core's post-sublayer norms


def _paired_mrope_model(config):
    from pai_zoo.mcore.build import model_base
    from pai_zoo.mcore.mrope_pairs import paired_mrope_class

    return paired_mrope_class(model_base())


GLM4V = Family(
    name="glm4v",
    aliases=("glm-4.1v", "glm4.1v"),
    hf_architectures=("Glm4vForConditionalGeneration",),
    model_types=("glm4v",),
    presets=GLM4V_PRESETS,
    tiny="glm4v-tiny",
    odd="glm4v-odd",
    config_map=GLM4V_CONFIG,
    weight_map=glm4v_weights,
    layer_spec=_glm4v_layer_spec,
    model_class=_paired_mrope_model,
    hf_model_class=LazyClass("transformers:Glm4vForConditionalGeneration"),
    test_tokenizer=write_test_tokenizer,
    vision=GLM_VISION,
    backends=("local",),  # the tower is megatron-core's local layers; Transformer Engine is untested here
    description="GLM-4.1V (Glm4vForConditionalGeneration): GLM-4V tower, M-RoPE on interleaved pairs, images "
                "and video",
)

GLM4V_MOE = Family(
    name="glm4v_moe",
    aliases=("glm4v-moe", "glm-4.5v-moe"),
    hf_architectures=("Glm4vMoeForConditionalGeneration",),
    model_types=("glm4v_moe",),
    presets=GLM4V_MOE_PRESETS,
    tiny="glm4v_moe-tiny",
    odd="glm4v_moe-odd",
    config_map=GLM4V_MOE_CONFIG,
    weight_map=glm4v_moe_weights,
    hf_model_class=LazyClass("transformers:Glm4vMoeForConditionalGeneration"),
    test_tokenizer=write_test_tokenizer,
    vision=GLM_VISION,
    backends=("local",),
    description="GLM-4.5V (Glm4vMoeForConditionalGeneration): GLM-4V tower, GLM-4.5's sigmoid-routed experts",
)


@hookimpl
def pai_zoo_families():
    return [GLM4V, GLM4V_MOE]
