"""Hugging Face configs of the published GLM-4 checkpoints (transformers' layout), plus tiny ones for tests."""
from __future__ import annotations

GLM_EOS = [151329, 151336, 151338]  # <|endoftext|>, <|user|>, <|observation|>
GLM_PAD = 151329
#: The same tokens in the test tokenizer (write_glm4_tokenizer: special tokens after its 400 learnt ones, in
#: GLM-4's order), for the tiny and odd presets. GLM-4 has no BOS id.
TOY_EOS = [400, 407, 409]
TOY_PAD = 400


def _glm(model_type, hidden, inter, layers, heads, kv, *, max_pos, eps, vocab=151552):
    return dict(
        model_type=model_type, architectures=["GlmForCausalLM" if model_type == "glm" else "Glm4ForCausalLM"],
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, hidden_act="silu", attention_dropout=0.0,
        max_position_embeddings=max_pos, rms_norm_eps=eps, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        pad_token_id=GLM_PAD, eos_token_id=GLM_EOS,
    )


def _tiny(model_type):
    # GQA (4 query heads per group), QKV bias, head_dim 16 != 64 / 8, interleaved rotary on half of each head,
    # vocabulary not a multiple of 128, 288 positions.
    return {
        **_glm(model_type, 64, 160, 2, 8, 2, max_pos=288, eps=1e-5, vocab=1000),
        "head_dim": 16, "pad_token_id": TOY_PAD, "eos_token_id": TOY_EOS,
    }


PRESETS = {
    "glm4-tiny": _tiny("glm4"),  # Glm4ForCausalLM: post-attention and post-MLP norms
    "glm-tiny": _tiny("glm"),  # GlmForCausalLM
    # Unusual shapes (Family.odd), Glm4ForCausalLM with its post norms: 6 query heads in 2 key/value groups (GQA
    # ratio 3), head_dim 20 != 72 / 6 with interleaved rotary on 10 channels (5 pairs), vocabulary 997, QKV bias,
    # rms_norm_eps 1e-6, rope theta 50000, 300 positions. The variant tests run it as GlmForCausalLM too.
    "glm4-odd": {
        **_glm("glm4", 72, 136, 2, 6, 2, max_pos=300, eps=1e-6, vocab=997),
        "head_dim": 20,
        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5},
        "pad_token_id": TOY_PAD,
        "eos_token_id": TOY_EOS,
    },
    "glm-4-9b": _glm("glm", 4096, 13696, 40, 32, 2, max_pos=8192, eps=1.5625e-07),  # THUDM/glm-4-9b-hf
    "glm-4-9b-chat": _glm("glm", 4096, 13696, 40, 32, 2, max_pos=131072, eps=1.5625e-07),  # THUDM/glm-4-9b-chat-hf
    "glm-4-9b-0414": _glm("glm4", 4096, 13696, 40, 32, 2, max_pos=32768, eps=1e-5),  # THUDM/GLM-4-9B-0414
    "glm-4-32b-0414": _glm("glm4", 6144, 23040, 61, 48, 2, max_pos=32768, eps=1e-5),  # THUDM/GLM-4-32B-0414
}
