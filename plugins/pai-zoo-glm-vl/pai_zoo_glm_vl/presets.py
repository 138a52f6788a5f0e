"""GLM-4.1V and GLM-4.5V configs in transformers' nested form, plus tiny and odd ones for tests.

The published sizes are **from memory** of the checkpoints' ``config.json`` (no model hub here); a user converts
the downloaded folder itself, whose ``config.json`` is what counts. The test presets use the test tokenizer's ids
(:mod:`pai_zoo_glm_vl.processor_files`).
"""
from __future__ import annotations

from .processor_files import TOY_EOS, TOY_IDS, TOY_PAD

#: The published checkpoints' ids (GLM-4 tokenizer); GLM-4.5V's placeholders are 151363/151364.
GLM4V_IDS = {"image_start_token_id": 151339, "image_end_token_id": 151340, "video_start_token_id": 151341,
             "video_end_token_id": 151342, "image_token_id": 151343, "video_token_id": 151344}
GLM45V_IDS = {**GLM4V_IDS, "image_token_id": 151363, "video_token_id": 151364}
GLM_EOS, GLM_PAD = [151329, 151336, 151338], 151329


def _rope(section, theta=10000.0):
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.5, "mrope_section": list(section)}


def _text(hidden, inter, layers, heads, kv, vocab, *, section, max_pos=65536, eps=1e-5, theta=10000.0,
          eos=GLM_EOS, pad=GLM_PAD, **more):
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu", attention_dropout=0.0,
                max_position_embeddings=max_pos, rms_norm_eps=eps, rope_parameters=_rope(section, theta),
                eos_token_id=eos, pad_token_id=pad, **more)


def _moe_text(hidden, inter, layers, heads, kv, vocab, *, experts, topk, expert_ffn, shared, dense, scaling,
              groups=(1, 1), **more):
    return _text(hidden, inter, layers, heads, kv, vocab, attention_bias=True, n_routed_experts=experts,
                 num_experts_per_tok=topk, moe_intermediate_size=expert_ffn, n_shared_experts=shared,
                 first_k_dense_replace=dense, routed_scaling_factor=scaling, norm_topk_prob=True,
                 n_group=groups[0], topk_group=groups[1], **more)


def _vision(depth, dim, heads, out, inter, *, image_size=336, bias=False, eps=1e-5):
    return {"depth": depth, "hidden_size": dim, "num_heads": heads, "out_hidden_size": out,
            "intermediate_size": inter, "patch_size": 14, "image_size": image_size, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "in_channels": 3, "hidden_act": "silu", "rms_norm_eps": eps,
            "attention_bias": bias, "attention_dropout": 0.0, "rope_parameters": {"rope_type": "axial",
                                                                                    "rope_theta": 10000.0}}


def _vl(arch, text, vision, ids, tie=False):
    model_type = "glm4v" if arch == "Glm4vForConditionalGeneration" else "glm4v_moe"
    return {"model_type": model_type, "architectures": [arch], "text_config": text, "vision_config": vision,
            "tie_word_embeddings": tie, **ids}


_DENSE, _MOE = "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration"
_TOY = {"eos": TOY_EOS, "pad": TOY_PAD}

GLM4V_PRESETS = {
    # 4 heads (2 KV groups), head_dim 16 with interleaved M-RoPE on 8 channels (sections [2, 1, 1]); a 2-layer tower
    # of width 32 in 4 heads, a 4 x 4 position table (image_size 56) interpolated to every image's grid.
    "glm4v-tiny": _vl(_DENSE, _text(64, 96, 2, 4, 2, 1000, section=(2, 1, 1), max_pos=1024, **_TOY),
                      _vision(2, 32, 4, 64, 80, image_size=56), TOY_IDS),
    # Unusual shapes: 6 query heads in 2 groups (GQA 3), head_dim 12 (transformers' GLM-4.1V attention has no
    # head_dim of its own), rotary on 6 channels in sections [1, 1, 1], vocabulary 997, rms eps 1e-6, theta 50000;
    # a 3-layer tower of width 72 in 6 heads with QKV bias, merger width 100, a 5 x 5 position table that no test
    # grid divides evenly.
    "glm4v-odd": _vl(_DENSE, _text(72, 136, 2, 6, 2, 997, section=(1, 1, 1), max_pos=1000, eps=1e-6,
                                   theta=50000.0, **_TOY), _vision(3, 72, 6, 72, 100, image_size=70, bias=True),
                     TOY_IDS),
    # zai-org/GLM-4.1V-9B-Thinking, from memory.
    "glm-4.1v-9b-thinking": _vl(_DENSE, _text(4096, 13696, 40, 32, 2, 151552, section=(8, 12, 12)),
                                _vision(24, 1536, 12, 4096, 13696), GLM4V_IDS),
}

GLM4V_MOE_PRESETS = {
    # 2 layers (layer 0 dense, layer 1 MoE), 4 experts in 2 groups (one chosen), top-2 sigmoid routing with the
    # score-correction bias and a routed scaling of 2.5, one shared expert, M-RoPE on halves of 8 channels.
    "glm4v_moe-tiny": _vl(_MOE, _moe_text(64, 96, 2, 4, 2, 1000, experts=4, topk=2, expert_ffn=32, shared=1,
                                          dense=1, scaling=2.5, groups=(2, 1), section=(2, 1, 1), max_pos=1024,
                                          **_TOY), _vision(2, 32, 4, 64, 80, image_size=56), TOY_IDS),
    # Unusual shapes: 6 query heads in 2 groups (GQA 3), head_dim 20 != 48 / 6 with rotary on 10 channels in
    # sections [1, 2, 2], vocabulary 997, 4 experts top-3, two shared experts, rms eps 1e-6; the odd tower.
    "glm4v_moe-odd": _vl(_MOE, _moe_text(48, 120, 2, 6, 2, 997, experts=4, topk=3, expert_ffn=40, shared=2,
                                         dense=1, scaling=1.0, section=(1, 2, 2), max_pos=1000, eps=1e-6,
                                         theta=50000.0, head_dim=20, **_TOY),
                         _vision(3, 72, 6, 48, 100, image_size=70, bias=True), TOY_IDS),
    # zai-org/GLM-4.5V (106B total, 12B active; GLM-4.5-Air's language model), from memory.
    "glm-4.5v": _vl(_MOE, _moe_text(4096, 10944, 46, 96, 8, 151552, experts=128, topk=8, expert_ffn=1408, shared=1,
                                    dense=1, scaling=1.0, section=(8, 12, 12), head_dim=128),
                    _vision(24, 1536, 12, 4096, 10944), GLM45V_IDS),
}
