"""Gemma 3's vision-language model (transformers' ``Gemma3ForConditionalGeneration``, model type ``gemma3``): the
family ``gemma3``.

* the language model is Gemma 3's text model, translated by :data:`pai_zoo_gemma.GEMMA3_CONFIG` from
  ``text_config`` (sliding and full layers with a RoPE each, q/k norms, sandwich norms, the embedding scale, the
  optional final soft-cap);
* the tower is SigLIP (:class:`pai_zoo.mcore.siglip.SiglipTower`, ``last_hidden_state``: the last layer after
  ``post_layernorm``), then transformers' ``Gemma3MultiModalProjector``: an average pool of the patch grid down to
  ``mm_tokens_per_image`` tokens (kernel ``patches // sqrt(mm_tokens_per_image)``, trailing patches dropped as
  ``AvgPool2d`` does), Gemma's RMSNorm (``1 + weight``) and a projection ``[vision width, text width]``; the
  projector is replicated over tensor parallelism;
* every image (and every pan-and-scan crop the checkpoint's own ``Gemma3Processor`` makes: pai-zoo reads only its
  ``pixel_values``) is one run of ``mm_tokens_per_image`` ``<image_soft_token>`` s, which attend to each other
  bidirectionally inside the causal model (:mod:`pai_zoo.mcore.image_attention`, transformers' ``token_type_ids``);
* positions are the language model's plain ones (``VisionSpec.positions=None``), pixels come without grids.
"""
from __future__ import annotations

import copy

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.plugin.nested_config import TEXT_EXTRA, NestedVisionConfig, family_key
from pai_zoo.tables.mapping.siglip_rows import check_siglip
from pai_zoo.vision import VISION_KEY, VisionSpec

#: Top-level keys of ``Gemma3Config`` kept under ``family.<key>``.
TOKEN_KEYS = ("mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index")
LM, TOWER, PROJECTOR = "language_model.", "vision_model.encoder.", "vision_model.projector."


token_key = family_key


def pooling(settings: dict, mm_tokens: int) -> tuple[int, int, int]:
    """``(patches per side, tokens per side, kernel)`` of the projector's average pool, as transformers'
    ``Gemma3MultiModalProjector`` computes them."""
    patches = settings["image_size"] // settings["patch_size"]
    side = int(mm_tokens ** 0.5)
    return patches, side, patches // max(side, 1)


def _check(vision: dict, mm_tokens: int, text_vocab: int, image_token: int) -> None:
    from pai_zoo.plugin.errors import ConfigTranslationError as Refusal

    patches, side, kernel = pooling(vision, mm_tokens)
    if side * side != mm_tokens or kernel < 1 or (patches - kernel) // kernel + 1 != side:
        raise Refusal(f"mm_tokens_per_image={mm_tokens} does not pool a {patches} x {patches} patch grid (image_size "
                      f"{vision['image_size']} / patch_size {vision['patch_size']}) to a square of tokens; give a "
                      "square number that pools it")
    if not 0 <= image_token < text_vocab:
        raise Refusal(f"image_token_index={image_token} is outside the text vocabulary ({text_vocab}); pai-zoo "
                      "embeds the placeholders before the tower's rows replace them")


class Gemma3VLConfig(NestedVisionConfig):
    """``Gemma3Config`` (``text_config``, ``vision_config``, the image token ids) <-> one ``McoreConfig``: the text
    config through Gemma 3's rules, the SigLIP settings under ``family.vision``, the token ids under ``family.*``
    (the core's :class:`~pai_zoo.plugin.nested_config.NestedVisionConfig` with Gemma 3's defaults and checks)."""

    def __init__(self, text_map: ConfigMap, text_model_type: str = "gemma3_text",
                 vision_model_type: str = "siglip_vision_model"):
        super().__init__(text_map, text_model_type, vision_model_type, top_keys=TOKEN_KEYS, tie_default=True,
                         source="Gemma3Config")

    def text_in(self, hf: dict) -> dict:
        text = {k: v for k, v in super().text_in(hf).items() if k != "model_type"}
        if text.get("final_logit_softcapping") is not None:
            raise ConfigTranslationError(
                f"text_config.final_logit_softcapping={text['final_logit_softcapping']!r}: transformers' "
                "Gemma3ForConditionalGeneration does not apply it (only Gemma3ForCausalLM does), and no published "
                "Gemma 3 sets it; set it to null")
        return text

    def vision_in(self, vision: dict) -> dict:
        vision = super().vision_in(vision)
        check_siglip(vision)
        return vision

    def top_in(self, hf: dict, arch: dict) -> dict:
        tokens = {"mm_tokens_per_image": 256, "boi_token_index": 255_999, "eoi_token_index": 256_000,
                  "image_token_index": 262_144}  # Gemma3Config's defaults
        tokens.update({k: hf[k] for k in TOKEN_KEYS if hf.get(k) is not None})
        _check(arch[VISION_KEY], int(tokens["mm_tokens_per_image"]), arch["vocab_size"],
               int(tokens["image_token_index"]))
        for key in TOKEN_KEYS:
            arch[token_key(key)] = int(tokens[key])
        return {k: arch[token_key(k)] for k in TOKEN_KEYS if k not in hf}

    def to_mcore(self, family: str, hf: dict) -> McoreConfig:
        config = super().to_mcore(family, hf)
        if "tie_word_embeddings" in hf["text_config"]:  # the text config's own (the top-level one ties the head)
            config.hf_extra[TEXT_EXTRA]["tie_word_embeddings"] = hf["text_config"]["tie_word_embeddings"]
        return config


def settings(config: McoreConfig) -> dict:
    return dict(config[VISION_KEY])


def _tower(config, lm_config):
    from .gemma3_vl_tower import Gemma3Vision

    return Gemma3Vision(config, lm_config)


def _placeholders(config) -> dict[str, int]:
    return {"image": config[token_key("image_token_index")]}


def _tokens(config, grid=None) -> int:
    return config[token_key("mm_tokens_per_image")]


def _hf_inputs(config, input_ids) -> dict:
    """transformers' ``token_type_ids`` as ``Gemma3Processor`` makes them: 1 on the image tokens."""
    return {"token_type_ids": (input_ids == config[token_key("image_token_index")]).long()}


def _blocks(config, input_ids):
    from pai_zoo.mcore.image_attention import image_blocks

    return image_blocks(input_ids, config[token_key("image_token_index")])


def _parameters(config, tp: int = 1) -> tuple[int, int]:
    from pai_zoo.tables.mapping.siglip_rows import siglip_parameters

    v = settings(config)
    projector = v["hidden_size"] + v["hidden_size"] * config["hidden_size"]
    return siglip_parameters(v, tp) + projector, projector


def _example(config, generator) -> dict:
    """One prompt (the suite's checks take one row): two images between text, text after them; random pixels."""
    import torch

    v = settings(config)
    boi, eoi = config[token_key("boi_token_index")], config[token_key("eoi_token_index")]
    image, mm = config[token_key("image_token_index")], config[token_key("mm_tokens_per_image")]
    low = max(boi, eoi, image) + 1  # text ids above the special ones

    def text(n):
        return torch.randint(low, config["vocab_size"], (n,), generator=generator).tolist()

    block = [boi] + [image] * mm + [eoi]
    ids = text(3) + block + text(4) + block + text(6)
    pixels = torch.rand(2, v.get("num_channels", 3), v["image_size"], v["image_size"], generator=generator) * 2 - 1
    return {"input_ids": torch.tensor([ids]), "pixel_values": pixels}


GEMMA3_VISION = VisionSpec(
    tower=_tower, placeholders=_placeholders, positions=None, tokens=_tokens, example=_example,
    projector_prefix=PROJECTOR, modalities=("image",), parameters=_parameters,
    inputs=("token_type_ids", "num_crops"), grids=False, hf_inputs=_hf_inputs, bidirectional=_blocks,
)


#: transformers 5 holds the parts under model.language_model. / model.vision_tower. / model.multi_modal_projector. in
#: memory and saves them under the published names (language_model.model., vision_tower., ...).
GEMMA3_VL_MODULES = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                     ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector."))


def _prefixed(row, prefix: str):
    out = copy.copy(row)
    out.hf = tuple(prefix + name for name in row.hf)
    return out


def gemma3_vl_weights(config: McoreConfig, text_weights) -> WeightMap:
    """Gemma 3's text table under ``language_model.`` (the checkpoint's names), the SigLIP tower's rows, the
    projector's."""
    from pai_zoo.tables.mapping.siglip_rows import siglip_rows

    rows = [_prefixed(row, LM) for row in text_weights(config).rows]
    rows += siglip_rows(settings(config), "vision_tower.", TOWER)
    rows += [Copy("multi_modal_projector.mm_input_projection_weight", PROJECTOR + "mm_input_projection_weight"),
             Copy("multi_modal_projector.mm_soft_emb_norm.weight", PROJECTOR + "mm_soft_emb_norm.weight")]
    return WeightMap(*rows)
