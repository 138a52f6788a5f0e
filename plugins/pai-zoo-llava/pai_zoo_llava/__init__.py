"""pai-zoo plugin for LLaVA-OneVision: the family ``llava_onevision`` (transformers'
``LlavaOnevisionForConditionalGeneration``): a SigLIP tower (the core's :class:`pai_zoo.mcore.siglip.SiglipTower`),
an MLP projector, AnyRes tiles with the unpadding step and ``image_newline``, video frames pooled 2 x 2, and
Qwen2's language model with plain RoPE.

The language model is megatron-core's ``GPTModel``; the tower is :class:`pai_zoo_llava.tower.LlavaOnevisionTower`
on the first pipeline stage (:mod:`pai_zoo.mcore.multimodal`). Tiles and crops come from the checkpoint's own
transformers image processor: pai-zoo reads its ``pixel_values``, ``image_sizes`` and ``batch_num_images``.
"""
from __future__ import annotations

from pai_zoo import Family, hookimpl
from pai_zoo.family import LazyClass
from pai_zoo.vision import VisionSpec

from .config import LLAVA_KEY, LlavaOnevisionConfigMap, llava_settings
from .presets import LLAVA_ONEVISION_PRESETS
from .processor_files import write_test_tokenizer
from .weights import llava_weights


def _tower(config, lm_config):
    from .tower import LlavaOnevisionTower

    return LlavaOnevisionTower(config, lm_config)


def _placeholders(config) -> dict[str, int]:
    s = config[LLAVA_KEY]
    return {"image": int(s.get("image_token_index", 151646)), "video": int(s.get("video_token_index", 151647))}


def _tokens(config, size) -> int:
    """Placeholder tokens of one image alone in its prompt, from its ``(height, width)`` (the processor's
    ``image_sizes`` row): the AnyRes count transformers' processor makes."""
    from .anyres import image_tokens

    return image_tokens([int(v) for v in size], True, llava_settings(config))


def _parameters(config, tp: int = 1) -> tuple[int, int]:
    """``(tower, projector)`` parameters on one tensor-parallel rank: SigLIP's (layers split), the projector and
    ``image_newline`` (replicated)."""
    from pai_zoo.tables.mapping.siglip_rows import siglip_parameters
    from pai_zoo.vision import VISION_KEY

    s = llava_settings(config)
    hidden, bias = config["hidden_size"], s["multimodal_projector_bias"]
    projector = s["width"] * hidden + hidden * hidden + (2 * hidden if bias else 0)
    return siglip_parameters(config[VISION_KEY], tp) + projector + hidden, projector


def _example(config, generator) -> dict:
    """One prompt: an image alone (AnyRes: 2 x 2 tiles, the padding rows cut unevenly, and on the odd preset the
    bilinear shrink of ``anyres_max_1``) and a 4-frame video, random pixels."""
    import torch

    from .anyres import image_tokens, tiles_per_image, video_tokens

    s = llava_settings(config)
    ids = _placeholders(config)
    tile = s["tile"]
    size = [tile + 7, 2 * tile - 5]  # a little wide: the 2 x 2 grid, rows of padding above and below to cut
    tiles = tiles_per_image([size], [1], s["image_grid_pinpoints"], tile)[0]
    vocab = min(int(config["vocab_size"]), ids["image"])

    def text(n):
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    prompt = (text(3) + [ids["image"]] * image_tokens(size, True, s) + text(2)
              + [ids["video"]] * video_tokens(4, s) + text(2))
    return {"input_ids": torch.tensor([prompt]),
            "pixel_values": torch.randn(1, tiles, 3, tile, tile, generator=generator),
            "image_sizes": torch.tensor([size]), "batch_num_images": torch.tensor([1]),
            "pixel_values_videos": torch.randn(1, 4, 3, tile, tile, generator=generator)}


LLAVA_ONEVISION_VISION = VisionSpec(
    tower=_tower, placeholders=_placeholders, positions=None, tokens=_tokens, example=_example,
    projector_prefix="vision_model.projector.", parameters=_parameters,
    inputs=("image_sizes", "batch_num_images"), grids=False, hf_inputs=lambda config, input_ids: {},
)

#: transformers 5 holds the parts under model.* in memory and saves them as below (the tower without the
#: ``vision_model.`` level that checkpoints saved by transformers 4 have: those are read under these names).
MODULE_PREFIXES = (("language_model.lm_head.", "lm_head."), ("language_model.model.", "model.language_model."),
                   ("vision_tower.", "model.vision_tower."),
                   ("multi_modal_projector.", "model.multi_modal_projector."), ("image_newline", "model.image_newline"))

LLAVA_ONEVISION = Family(
    name="llava_onevision",
    aliases=("llava-onevision", "llava_ov"),
    hf_architectures=("LlavaOnevisionForConditionalGeneration",),
    model_types=("llava_onevision",),
    presets=LLAVA_ONEVISION_PRESETS,
    tiny="llava_onevision-tiny",
    odd="llava_onevision-odd",
    config_map=LlavaOnevisionConfigMap(),
    weight_map=llava_weights,
    hf_model_class=LazyClass("transformers:LlavaOnevisionForConditionalGeneration"),
    test_tokenizer=write_test_tokenizer,
    vision=LLAVA_ONEVISION_VISION,
    hf_module_prefixes=MODULE_PREFIXES,
    hf_legacy_prefixes=(("vision_tower.vision_model.", "vision_tower."),),  # as transformers 4 saved the tower
    backends=("local",),  # the tower is megatron-core's local layers; Transformer Engine is untested here
    description="LLaVA-OneVision (LlavaOnevisionForConditionalGeneration): SigLIP, AnyRes tiles, video, Qwen2",
)


@hookimpl
def pai_zoo_families():
    return [LLAVA_ONEVISION]
