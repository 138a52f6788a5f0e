"""Qwen2-VL and Qwen2.5-VL configs in the published ``config.json`` form (text keys at the top level,
``rope_scaling: {type: mrope, mrope_section}``, ``vision_config`` nested), plus tiny and odd ones for tests.

The published sizes are **from memory** of the checkpoints' ``config.json`` (no model hub here); a user converts
the downloaded folder itself, whose ``config.json`` is what counts. The test presets use the test tokenizer's ids
(:mod:`pai_zoo_qwen_vl.processor_files`).
"""
from __future__ import annotations

from .processor_files import TOY_IDS

#: The published checkpoints' special ids (Qwen2 tokenizer).
PUBLISHED_IDS = {"bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
                 "vision_end_token_id": 151653, "image_token_id": 151655, "video_token_id": 151656}


def _text(model_type, hidden, inter, layers, heads, kv, vocab, *, tie, max_pos, section, eps=1e-6, theta=1e6,
          ids=None):
    arch = "Qwen2VLForConditionalGeneration" if model_type == "qwen2_vl" else "Qwen2_5_VLForConditionalGeneration"
    return dict(
        model_type=model_type, architectures=[arch], vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max_pos,
        rms_norm_eps=eps, rope_theta=theta, rope_scaling={"type": "mrope", "mrope_section": list(section)},
        hidden_act="silu", tie_word_embeddings=tie, use_sliding_window=False, sliding_window=max_pos,
        max_window_layers=layers, attention_dropout=0.0, **(ids or PUBLISHED_IDS),
    )


def _qwen2_vision(depth, dim, heads, out, *, patch=14, mlp_ratio=4):
    return {"depth": depth, "embed_dim": dim, "num_heads": heads, "hidden_size": out, "mlp_ratio": mlp_ratio,
            "patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "quick_gelu",
            "in_channels": 3}


def _qwen25_vision(depth, dim, heads, inter, out, *, window, full, patch=14, tokens_per_second=2):
    return {"depth": depth, "hidden_size": dim, "num_heads": heads, "intermediate_size": inter,
            "out_hidden_size": out, "patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "hidden_act": "silu", "in_channels": 3, "window_size": window, "fullatt_block_indexes": list(full),
            "tokens_per_second": tokens_per_second}


def _vl(text, vision):
    return {**text, "vision_config": vision}


_FULL = (7, 15, 23, 31)

QWEN2_VL_PRESETS = {
    # 4 heads (2 KV), M-RoPE sections [2, 3, 3] of head_dim 16; a 2-layer tower of width 32, 4 heads.
    "qwen2-vl-tiny": _vl(_text("qwen2_vl", 64, 160, 2, 4, 2, 1000, tie=True, max_pos=1024, section=(2, 3, 3),
                               ids=TOY_IDS), _qwen2_vision(2, 32, 4, 64, mlp_ratio=2)),
    # Unusual shapes: 6 query heads in 2 groups (GQA 3), head_dim 12, vocabulary 1001, untied head, rope theta
    # 123456, rms eps 1e-5; a 3-layer tower of width 72 in 6 heads (head_dim 12), mlp_ratio 3.
    "qwen2-vl-odd": _vl(_text("qwen2_vl", 72, 136, 2, 6, 2, 1001, tie=False, max_pos=1000, section=(2, 2, 2),
                              eps=1e-5, theta=123456.0, ids=TOY_IDS), _qwen2_vision(3, 72, 6, 72, mlp_ratio=3)),
    "qwen2-vl-2b": _vl(_text("qwen2_vl", 1536, 8960, 28, 12, 2, 151936, tie=True, max_pos=32768,
                             section=(16, 24, 24)), _qwen2_vision(32, 1280, 16, 1536)),
    "qwen2-vl-7b": _vl(_text("qwen2_vl", 3584, 18944, 28, 28, 4, 152064, tie=False, max_pos=32768,
                             section=(16, 24, 24)), _qwen2_vision(32, 1280, 16, 3584)),
    "qwen2-vl-72b": _vl(_text("qwen2_vl", 8192, 29568, 80, 64, 8, 152064, tie=False, max_pos=32768,
                              section=(16, 24, 24), eps=1e-6), _qwen2_vision(32, 1280, 16, 8192)),
}

QWEN2_5_VL_PRESETS = {
    # a 2-layer tower (layer 1 full attention, layer 0 in windows of 2 x 2 merged tokens), SwiGLU width 48.
    "qwen2.5-vl-tiny": _vl(_text("qwen2_5_vl", 64, 160, 2, 4, 2, 1000, tie=True, max_pos=1024, section=(2, 3, 3),
                                 ids=TOY_IDS), _qwen25_vision(2, 32, 4, 48, 64, window=56, full=(1,))),
    # Unusual shapes: as qwen2-vl-odd in the language model; a 3-layer tower of width 72 in 6 heads, SwiGLU width
    # 100, windows of 3 x 3 merged tokens (window_size 84) that split most images unevenly, layers 0 and 2 windowed.
    "qwen2.5-vl-odd": _vl(_text("qwen2_5_vl", 72, 136, 2, 6, 2, 1001, tie=False, max_pos=1000, section=(2, 2, 2),
                                eps=1e-5, theta=123456.0, ids=TOY_IDS),
                          _qwen25_vision(3, 72, 6, 100, 72, window=84, full=(1,))),
    "qwen2.5-vl-3b": _vl(_text("qwen2_5_vl", 2048, 11008, 36, 16, 2, 151936, tie=True, max_pos=128000,
                               section=(16, 24, 24)), _qwen25_vision(32, 1280, 16, 3420, 2048, window=112, full=_FULL)),
    "qwen2.5-vl-7b": _vl(_text("qwen2_5_vl", 3584, 18944, 28, 28, 4, 152064, tie=False, max_pos=128000,
                               section=(16, 24, 24)), _qwen25_vision(32, 1280, 16, 3420, 3584, window=112, full=_FULL)),
    "qwen2.5-vl-32b": _vl(_text("qwen2_5_vl", 5120, 27648, 64, 40, 8, 152064, tie=False, max_pos=128000,
                                section=(16, 24, 24)),
                          _qwen25_vision(32, 1280, 16, 3456, 5120, window=112, full=_FULL)),
    "qwen2.5-vl-72b": _vl(_text("qwen2_5_vl", 8192, 29568, 80, 64, 8, 152064, tie=False, max_pos=128000,
                                section=(16, 24, 24)),
                          _qwen25_vision(32, 1280, 16, 3456, 8192, window=112, full=_FULL)),
}
