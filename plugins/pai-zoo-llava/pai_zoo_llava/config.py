"""LLaVA-OneVision's nested config ``{text_config, vision_config, <projector and AnyRes keys>}`` <-> one
:class:`~pai_zoo.config_map.McoreConfig`.

The language model is Qwen2's translation (:data:`pai_zoo_qwen.QWEN2_CONFIG`) run on ``text_config``, with plain
RoPE; SigLIP's settings travel as one dict under ``family.vision`` and the top-level keys (placeholder ids,
projector, AnyRes pinpoints, ``vision_aspect_ratio``) as one dict under ``family.llava``.
"""
from __future__ import annotations

import re

from pai_zoo import ConfigTranslationError
from pai_zoo.config_map import McoreConfig
from pai_zoo.plugin.config_map import FAMILY_KEY_PREFIX
from pai_zoo.plugin.nested_config import NestedVisionConfig
from pai_zoo.vision import VISION_KEY
from pai_zoo_qwen import QWEN2_CONFIG

#: Where the top-level LLaVA keys travel.
LLAVA_KEY = "family.llava"
#: The top-level keys of ``LlavaOnevisionConfig`` the model reads (kept as given, defaults filled by transformers).
LLAVA_KEYS = ("image_token_index", "video_token_index", "projector_hidden_act", "vision_feature_select_strategy",
              "vision_feature_layer", "multimodal_projector_bias", "image_grid_pinpoints", "vision_aspect_ratio")
#: transformers' ``LlavaOnevisionConfig`` defaults, for a config that leaves a key out.
DEFAULTS = {"image_token_index": 151646, "video_token_index": 151647, "projector_hidden_act": "gelu",
            "vision_feature_select_strategy": "full", "vision_feature_layer": -1, "multimodal_projector_bias": True,
            "vision_aspect_ratio": "anyres_max_9",
            "image_grid_pinpoints": [[h * 384, w * 384] for h in range(1, 7) for w in range(1, 7)]}
TEXT_TIE = "family.text_tie_word_embeddings"  # text_config's own tie_word_embeddings, where it has one
_ALIASES = {"image_token_id": "image_token_index", "video_token_id": "video_token_index"}


class LlavaOnevisionConfigMap(NestedVisionConfig):
    """Nested HF config <-> megatron-core config (see the module docstring): the core's
    :class:`~pai_zoo.plugin.nested_config.NestedVisionConfig`, the top-level keys as one dict."""

    def __init__(self):
        super().__init__(QWEN2_CONFIG, "qwen2", "siglip_vision_model", top_keys=(*LLAVA_KEYS, *_ALIASES),
                         source="LlavaOnevisionConfig")

    def text_in(self, hf: dict) -> dict:
        text = dict(hf["text_config"])
        if text.get("model_type", "qwen2") != "qwen2":
            raise ConfigTranslationError(f"text_config.model_type {text['model_type']!r}: pai-zoo's LLaVA-OneVision "
                                         "reads a Qwen2 language model (model_type 'qwen2'), as published")
        # LlavaOnevisionConfig ties when either config says so
        text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings", False) or text.get("tie_word_embeddings"))
        return text

    def vision_in(self, vision: dict) -> dict:
        if vision.get("model_type", "siglip_vision_model") != "siglip_vision_model":
            raise ConfigTranslationError(f"vision_config.model_type {vision['model_type']!r}: pai-zoo's "
                                         "LLaVA-OneVision reads a SigLIP tower (model_type 'siglip_vision_model')")
        return super().vision_in(vision)

    def top_in(self, hf: dict, arch: dict) -> dict:
        llava = {_ALIASES.get(k, k): v for k, v in hf.items() if _ALIASES.get(k, k) in LLAVA_KEYS}
        check_llava(llava, arch[VISION_KEY])
        arch.update({LLAVA_KEY: llava, TEXT_TIE: hf["text_config"].get("tie_word_embeddings")})
        return {}

    def top_out(self, config: McoreConfig) -> dict:
        return config[LLAVA_KEY]

    def own_keys(self, config: McoreConfig) -> set[str]:
        return {k for k in config.arch if k.startswith(FAMILY_KEY_PREFIX)}

    def text_out(self, config: McoreConfig, text: dict) -> None:
        if config.get(TEXT_TIE) is not None:
            text["tie_word_embeddings"] = config[TEXT_TIE]
        super().text_out(config, text)


def check_llava(llava: dict, vision: dict) -> None:
    """One :class:`ConfigTranslationError` line for what pai-zoo's LLaVA-OneVision does not compute."""
    s = {**DEFAULTS, **llava}
    if s["vision_feature_select_strategy"] != "full":
        raise ConfigTranslationError(
            f"vision_feature_select_strategy {s['vision_feature_select_strategy']!r}: SigLIP has no CLS token to drop "
            "and transformers' own AnyRes path fails with 'default'; use 'full', as the published checkpoints do")
    layer = s["vision_feature_layer"]
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise ConfigTranslationError(f"vision_feature_layer {layer!r}: one layer index (an int) is supported, not a "
                                     "list of layers to concatenate; the published checkpoints use -1")
    depth = vision.get("num_hidden_layers", 12)
    if not -depth - 1 <= layer <= depth:
        raise ConfigTranslationError(f"vision_feature_layer {layer} is outside the tower's {depth} layers")
    if not re.fullmatch(r"anyres_max_\d+", str(s["vision_aspect_ratio"])):
        raise ConfigTranslationError(f"vision_aspect_ratio {s['vision_aspect_ratio']!r}: expected 'anyres_max_N' "
                                     "(transformers reads the number N of tiles an image may keep)")
    if vision.get("vision_use_head", True):  # SiglipVisionConfig's default is True
        raise ConfigTranslationError("vision_config.vision_use_head must be false: LLaVA-OneVision reads SigLIP's "
                                     "patch features, not its pooling head (set vision_use_head: false)")
    if s["projector_hidden_act"] not in PROJECTOR_ACTS:
        raise ConfigTranslationError(f"projector_hidden_act {s['projector_hidden_act']!r}: one of "
                                     f"{sorted(PROJECTOR_ACTS)}")


#: The projector activations pai-zoo computes (transformers' ACT2FN names).
PROJECTOR_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


def llava_settings(config: McoreConfig) -> dict:
    """The top-level settings with transformers' defaults filled in, and the tile geometry: ``tile`` pixels a side,
    ``side`` patches a side (``tile // patch``)."""
    s = {**DEFAULTS, **config[LLAVA_KEY]}
    v = config[VISION_KEY]
    s["tile"], s["patch"] = v.get("image_size", 224), v.get("patch_size", 16)
    s["side"] = s["tile"] // s["patch"]
    s["max_tiles"] = int(str(s["vision_aspect_ratio"]).removeprefix("anyres_max_"))
    s["width"] = v.get("hidden_size", 768)
    s["depth"] = v.get("num_hidden_layers", 12)
    return s
