"""LLaVA-OneVision configs as transformers' ``LlavaOnevisionConfig`` writes them (``text_config`` Qwen2,
``vision_config`` SigLIP, the projector and AnyRes settings at the top), plus tiny and odd ones for tests.

The published sizes are **from memory** of the llava-hf checkpoints' ``config.json`` (no model hub here); a user
converts the downloaded folder itself, whose ``config.json`` is what counts. The test presets use the test
tokenizer's ids (:mod:`pai_zoo_llava.processor_files`).
"""
from __future__ import annotations

from .processor_files import TOY_IDS

#: The published checkpoints' ids (Qwen2 tokenizer with ``<image>`` and ``<video>`` appended), from memory.
PUBLISHED_IDS = {"image_token_index": 151646, "video_token_index": 151647}

#: transformers' default AnyRes grid (``LlavaOnevisionConfig.image_grid_pinpoints``): 1 to 6 tiles of 384 a side.
PUBLISHED_PINPOINTS = [[h * 384, w * 384] for h in range(1, 7) for w in range(1, 7)]


def _text(hidden, inter, layers, heads, kv, vocab, *, tie, max_pos=32768, theta=1000000.0, eps=1e-6, **extra):
    return dict(
        model_type="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, hidden_act="silu",
        tie_word_embeddings=tie, use_sliding_window=False, sliding_window=None, max_window_layers=layers,
        attention_dropout=0.0, **extra,
    )


def _siglip(hidden, inter, layers, heads, *, image_size, patch_size):
    return dict(
        model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_channels=3, image_size=image_size,
        patch_size=patch_size, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attention_dropout=0.0,
        vision_use_head=False,
    )


def _llava(text, vision, *, tie, pinpoints, aspect="anyres_max_9", ids=None, feature_layer=-1):
    return dict(
        model_type="llava_onevision", architectures=["LlavaOnevisionForConditionalGeneration"],
        text_config=text, vision_config=vision, projector_hidden_act="gelu",
        vision_feature_select_strategy="full", vision_feature_layer=feature_layer, multimodal_projector_bias=True,
        tie_word_embeddings=tie, image_grid_pinpoints=[list(p) for p in pinpoints],
        vision_aspect_ratio=aspect, **(ids or PUBLISHED_IDS),
    )


#: The tiny preset's tiles: 28 x 28 pixels, 4 x 4 patches of 7 (16 tokens a tile); 1 x 1 to 2 x 2 tiles.
TINY_PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56]]
#: The odd preset's tiles: 30 x 30 pixels, 5 x 5 patches of 6 (25 tokens a tile, pooled to 3 x 3 in a video frame);
#: up to 3 tiles a side, so most images leave an uneven margin that unpadding cuts.
ODD_PINPOINTS = [[30, 30], [30, 60], [60, 30], [60, 60], [30, 90], [90, 30], [60, 90], [90, 60]]

LLAVA_ONEVISION_PRESETS = {
    # Qwen2 of width 64 (4 heads, 2 KV), a 2-layer SigLIP of width 32 in 4 heads; AnyRes up to 2 x 2 tiles.
    "llava_onevision-tiny": _llava(
        _text(64, 160, 2, 4, 2, 1000, tie=True, max_pos=1024, bos_token_id=TOY_IDS["bos_token_id"],
              eos_token_id=TOY_IDS["eos_token_id"]),
        _siglip(32, 48, 2, 4, image_size=28, patch_size=7), tie=True, pinpoints=TINY_PINPOINTS, ids=TOY_IDS["llava"]),
    # Unusual shapes: 6 query heads in 2 KV groups (GQA 3), head_dim 20 != 72 / 6, vocabulary 1001, untied head,
    # rope theta 123456, rms eps 1e-5; a 3-layer SigLIP of width 42 in 6 heads (head_dim 7), MLP width 50; tiles
    # of 5 x 5 patches; "anyres_max_1" so that an image of more than one tile is shrunk by the bilinear step;
    # features from the tower's second-last layer (vision_feature_layer -2: the last layer's weights carried, unused).
    "llava_onevision-odd": _llava(
        _text(72, 136, 2, 6, 2, 1001, tie=False, max_pos=1000, theta=123456.0, eps=1e-5, head_dim=20,
              bos_token_id=TOY_IDS["bos_token_id"], eos_token_id=TOY_IDS["eos_token_id"]),
        _siglip(42, 50, 3, 6, image_size=30, patch_size=6), tie=False, pinpoints=ODD_PINPOINTS,
        aspect="anyres_max_1", ids=TOY_IDS["llava"], feature_layer=-2),
    # from memory: llava-hf/llava-onevision-qwen2-0.5b-ov-hf (Qwen2-0.5B, SigLIP so400m/14 at 384)
    "llava-onevision-qwen2-0.5b-ov": _llava(
        _text(896, 4864, 24, 14, 2, 151936, tie=True), _siglip(1152, 4304, 26, 16, image_size=384, patch_size=14),
        tie=True, pinpoints=PUBLISHED_PINPOINTS),
    # from memory: llava-hf/llava-onevision-qwen2-7b-ov-hf (Qwen2-7B)
    "llava-onevision-qwen2-7b-ov": _llava(
        _text(3584, 18944, 28, 28, 4, 152128, tie=False), _siglip(1152, 4304, 26, 16, image_size=384, patch_size=14),
        tie=False, pinpoints=PUBLISHED_PINPOINTS),
    # from memory: llava-hf/llava-onevision-qwen2-72b-ov-hf (Qwen2-72B)
    "llava-onevision-qwen2-72b-ov": _llava(
        _text(8192, 29568, 80, 64, 8, 152128, tie=False),
        _siglip(1152, 4304, 26, 16, image_size=384, patch_size=14), tie=False, pinpoints=PUBLISHED_PINPOINTS),
}
