"""Configs of Gemma 3's vision-language model (``Gemma3ForConditionalGeneration``): tiny and odd ones for tests, and
the published sizes from memory.

The test presets' text models are the text family's ``gemma3-tiny`` and ``gemma3-odd``; their SigLIP towers read
49 x 49 images in 7 x 7 patches (a 7 x 7 grid that the projector pools with kernel 2 to 3 x 3 = 9 tokens, dropping
the last row and column of patches, as ``AvgPool2d`` does), so the test processor's files fit both. The 9-token image
block is longer than either sliding window (6 and 5 tokens): on the sliding layers an image token sees the whole of
its block ahead of it but only the window behind it. Token ids: the test tokenizer's ``<start_of_image>`` 4,
``<end_of_image>`` 5, ``<image_soft_token>`` 6 (:mod:`pai_zoo_gemma.gemma3_vl_processor`).
"""
from __future__ import annotations

from .presets import GEMMA3_PRESETS

#: the test tokenizer's image token ids
TEST_IMAGE_TOKENS = {"boi_token_index": 4, "eoi_token_index": 5, "image_token_index": 6}
#: the test processor's image size and tokens per image (one processor for both test presets)
TEST_IMAGE_SIZE, TEST_MM_TOKENS = 49, 9


def _siglip(hidden, inter, layers, heads, *, patch, image, eps=1e-6):
    return dict(model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, patch_size=patch, image_size=image,
                num_channels=3, layer_norm_eps=eps, hidden_act="gelu_pytorch_tanh", attention_dropout=0.0,
                vision_use_head=False)


def _vl(text: dict, vision: dict, *, mm_tokens=256, tokens=None, tie=True) -> dict:
    text = {k: v for k, v in text.items() if k != "architectures"}
    text.update(tie_word_embeddings=tie, final_logit_softcapping=None)  # the VL model applies no final cap
    return dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], text_config=text,
                vision_config=vision, mm_tokens_per_image=mm_tokens, tie_word_embeddings=tie,
                **(tokens or {"boi_token_index": 255_999, "eoi_token_index": 256_000, "image_token_index": 262_144}))


GEMMA3_VL_PRESETS = {
    # gemma3-tiny's text model (window 6, layers S S F S) and a SigLIP of 2 layers, width 32, 4 heads.
    "gemma3-vl-tiny": _vl(GEMMA3_PRESETS["gemma3-tiny"], _siglip(32, 48, 2, 4, patch=7, image=TEST_IMAGE_SIZE),
                          mm_tokens=TEST_MM_TOKENS, tokens=TEST_IMAGE_TOKENS),
    # Unusual shapes: gemma3-odd's text model (GQA 3, head_dim 20 != 48 / 6, vocabulary 997, window 5, layers
    # F S S, linear RoPE on the full layers, untied head; no final soft-cap, which the VL model never applies) and a
    # SigLIP of 3 layers, width 36, 6 heads of 6 (not a power of two), MLP 56, LayerNorm eps 1e-5.
    "gemma3-vl-odd": _vl(GEMMA3_PRESETS["gemma3-odd"],
                         _siglip(36, 56, 3, 6, patch=7, image=TEST_IMAGE_SIZE, eps=1e-5),
                         mm_tokens=TEST_MM_TOKENS, tokens=TEST_IMAGE_TOKENS, tie=False),
}

# From memory (not checked here, no network): google/gemma-3-{4b,12b,27b}-it's config.json: the text models of the
# text family's presets, SigLIP-So400m at 896 x 896 pixels in 14 x 14 patches (64 x 64, pooled to 16 x 16 = 256
# tokens), 27 layers, width 1152, MLP 4304, 16 heads.
_SIGLIP_SO400M = _siglip(1152, 4304, 27, 16, patch=14, image=896)
for _size in ("4b", "12b", "27b"):
    GEMMA3_VL_PRESETS[f"gemma-3-{_size}-it"] = _vl(GEMMA3_PRESETS[f"gemma-3-{_size}"], _SIGLIP_SO400M)
