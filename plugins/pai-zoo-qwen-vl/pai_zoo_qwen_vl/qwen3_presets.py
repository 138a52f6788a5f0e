"""Qwen3-VL and Qwen3-VL-MoE configs in the published ``config.json`` form (nested ``text_config`` and
``vision_config``, ``rope_parameters`` with interleaved ``mrope_section``), plus tiny and odd ones for tests.

The published sizes are **from memory** of the checkpoints' ``config.json`` (Qwen/Qwen3-VL-2B/4B/8B/32B-Instruct,
Qwen/Qwen3-VL-30B-A3B-Instruct, Qwen/Qwen3-VL-235B-A22B-Instruct; no model hub here); a user converts the
downloaded folder itself, whose ``config.json`` is what counts. The test presets use the test tokenizer's ids.

Every test preset puts its DeepStack levels into at least two language-model layers, all on the first pipeline
stage when the suite splits the tiny model over two (4 layers, 2 levels).
"""
from __future__ import annotations

from .presets import PUBLISHED_IDS
from .processor_files import TOY_IDS

_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def _text(hidden, inter, layers, heads, kv, vocab, *, head_dim=128, section=(24, 20, 20), theta=5000000.0,
          max_pos=262144, eps=1e-6, moe=None, ids=None):
    ids = ids or PUBLISHED_IDS
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu",
                max_position_embeddings=max_pos, rms_norm_eps=eps, attention_bias=False, attention_dropout=0.0,
                rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": list(section),
                                 "mrope_interleaved": True},
                bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"])
    if moe:
        experts, topk, expert_ffn = moe
        text.update(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=expert_ffn,
                    decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001)
    return text


def _vision(depth, dim, heads, inter, out, deepstack, *, positions=2304, patch=16):
    return {"depth": depth, "hidden_size": dim, "num_heads": heads, "intermediate_size": inter,
            "out_hidden_size": out, "patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "in_channels": 3, "hidden_act": "gelu_pytorch_tanh", "num_position_embeddings": positions,
            "deepstack_visual_indexes": list(deepstack)}


def _vl(model_type, text, vision, *, tie, ids=None):
    arch = "Qwen3VLMoeForConditionalGeneration" if model_type == "qwen3_vl_moe" else "Qwen3VLForConditionalGeneration"
    ids = ids or PUBLISHED_IDS
    return {"model_type": model_type, "architectures": [arch], "text_config": text, "vision_config": vision,
            "tie_word_embeddings": tie, **{k: ids[k] for k in _IDS}}


# tiny: 4 language-model layers (the suite's PP=2 keeps both DeepStack layers on the first stage), 4 heads in 2
# groups, head_dim 16, sections [2, 3, 3] interleaved; a 3-layer tower of width 48 in 6 heads, levels from layers
# 0 and 1, a 4 x 4 learned position table (the test images' grids are larger and uneven).
_TINY_V = _vision(3, 48, 6, 64, 64, (0, 1), positions=16)
# odd: 6 query heads in 2 groups (GQA 3), head_dim 20 != 72 / 6 with sections [4, 3, 3], vocabulary 1001, untied
# head, rope theta 123456,
# 3 layers each taking a DeepStack level; a 4-layer tower of width 72 in 6 heads (head_dim 12), MLP width 100,
# levels from tower layers 1, 2 and 3, a 5 x 5 position table.
_ODD_V = _vision(4, 72, 6, 100, 72, (1, 2, 3), positions=25)

QWEN3_VL_PRESETS = {
    "qwen3_vl-tiny": _vl("qwen3_vl", _text(64, 160, 4, 4, 2, 1000, head_dim=16, section=(2, 3, 3), max_pos=1024,
                                           ids=TOY_IDS), _TINY_V, tie=True, ids=TOY_IDS),
    "qwen3_vl-odd": _vl("qwen3_vl", _text(72, 136, 3, 6, 2, 1001, head_dim=20, section=(4, 3, 3), theta=123456.0,
                                          max_pos=1000, eps=1e-5, ids=TOY_IDS), _ODD_V, tie=False, ids=TOY_IDS),
    # Published sizes, from memory (unverified here).
    "qwen3_vl-2b": _vl("qwen3_vl", _text(2048, 6144, 28, 16, 8, 151936), _vision(24, 1024, 16, 4096, 2048, (5, 11, 17)),
                       tie=True),
    "qwen3_vl-4b": _vl("qwen3_vl", _text(2560, 9728, 36, 32, 8, 151936), _vision(24, 1024, 16, 4096, 2560, (5, 11, 17)),
                       tie=True),
    "qwen3_vl-8b": _vl("qwen3_vl", _text(4096, 12288, 36, 32, 8, 151936),
                       _vision(27, 1152, 16, 4304, 4096, (8, 16, 24)), tie=False),
    "qwen3_vl-32b": _vl("qwen3_vl", _text(5120, 25600, 64, 64, 8, 151936),
                        _vision(27, 1152, 16, 4304, 5120, (8, 16, 24)), tie=False),
}

QWEN3_VL_MOE_PRESETS = {
    # as qwen3_vl-tiny with 4 experts, top-2 (always renormalised), expert width 48.
    "qwen3_vl_moe-tiny": _vl("qwen3_vl_moe", _text(64, 160, 4, 4, 2, 1000, head_dim=16, section=(2, 3, 3),
                                                   max_pos=1024, moe=(4, 2, 48), ids=TOY_IDS),
                             _TINY_V, tie=True, ids=TOY_IDS),
    # as qwen3_vl-odd with 3 experts, top-2, expert width 40.
    "qwen3_vl_moe-odd": _vl("qwen3_vl_moe", _text(72, 136, 3, 6, 2, 1001, head_dim=20, section=(4, 3, 3),
                                                  theta=123456.0, max_pos=1000, eps=1e-5, moe=(3, 2, 40),
                                                  ids=TOY_IDS), _ODD_V, tie=False, ids=TOY_IDS),
    # Published sizes, from memory (unverified here).
    "qwen3_vl_moe-30b-a3b": _vl("qwen3_vl_moe", _text(2048, 6144, 48, 32, 4, 151936, moe=(128, 8, 768)),
                                _vision(27, 1152, 16, 4304, 2048, (8, 16, 24)), tie=False),
    "qwen3_vl_moe-235b-a22b": _vl("qwen3_vl_moe", _text(4096, 12288, 94, 64, 4, 151936, moe=(128, 8, 1536)),
                                  _vision(27, 1152, 16, 4304, 4096, (8, 16, 24)), tie=False),
}
