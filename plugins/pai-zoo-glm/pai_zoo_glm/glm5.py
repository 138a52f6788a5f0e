"""GLM-5 (``GlmMoeDsaForCausalLM``, model_type ``glm_moe_dsa``): DeepSeek-V3.2's architecture (MLA with q LoRA,
DeepSeek Sparse Attention, sigmoid-routed experts with expert bias and a shared expert, first-k dense layers, MTP),
built from pai-zoo-deepseek's parts (:mod:`pai_zoo_deepseek.dsa`).

What differs from DeepSeek-V3.2, as transformers 5.25 computes it:

* the indexer's RoPE rotates interleaved pairs (DeepSeek-V3.2: half-split channels);
* ``indexer_types``: a ``shared`` layer has no indexer and reuses the top-k of the nearest ``full`` layer before it
  (from ``index_topk_freq`` / ``index_skip_topk_offset`` or ``index_topk_pattern``; by default every layer is full);
* the defaults of its config class (``rms_norm_eps`` 1e-5, one expert group).

Everything else (MLA's interleaved RoPE, the indexer's scoring with ReLU and its LayerNorm key norm, the router) is
the same code.
"""
from __future__ import annotations

from pai_zoo import Family
from pai_zoo_deepseek import DEEPSEEK_V3_CONFIG
from pai_zoo_deepseek import megatron_lm as deepseek_megatron_lm
from pai_zoo_deepseek.dsa import dsa_config_map, dsa_layer_spec, dsa_weights
from pai_zoo_deepseek.presets import _deepseek, _yarn

from .presets_moe import TOY_EOS, TOY_PAD
from .tokenizer_files import write_glm4_tokenizer

__all__ = ["GLM5", "GLM5_CONFIG", "GLM5_PRESETS"]


def _glm5(indexer: tuple[int, int, int], eps: float, kinds: list[str] | None = None, **shape) -> dict:
    config = {k: v for k, v in _deepseek(3, **shape).items() if k != "rope_interleave"}
    heads, dim, topk = indexer
    config.update(model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"], rms_norm_eps=eps,
                  index_n_heads=heads, index_head_dim=dim, index_topk=topk)
    if kinds is not None:
        config["indexer_types"] = kinds
    return config


def _default(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


GLM5_PRESETS = {
    # Tiny GLM-5: 2 layers (the first dense), q LoRA, 4 experts top-2 in one group, an indexer of 8 heads x 16
    # channels (8 rotated, interleaved) keeping the top-8 keys in both layers (many heads: few exact ties at 0).
    "glm5-tiny": {**_glm5((8, 16, 8), 1e-5, vocab=512, hidden=64, inter=96, moe_inter=32, layers=2, heads=4,
                          q_lora=24, kv_lora=16, nope=16, rope=8, v=12, experts=4, topk=2, shared=1, first_dense=1,
                          groups=1, topk_group=1, scaling=2.5, norm_topk=True, max_pos=512,
                          rope_parameters=_default(1000000.0), bos=None, eos=TOY_EOS),
                  "pad_token_id": TOY_PAD},
    # Odd GLM-5: 3 layers, the last two ``shared`` (reusing layer 0's top-k: index_topk_freq 3, offset 1), 6 heads,
    # hidden 48, vocab 1001, v_head_dim != qk_nope_head_dim, 6 experts top-3, YaRN from 32 positions with an
    # attention factor != 1, 3 indexer heads x 10 channels (6 rotated), top-6 keys of the 16-token check.
    "glm5-odd": {**_glm5((3, 10, 6), 1e-6, ["full", "shared", "shared"], vocab=1001, hidden=48, inter=80,
                         moe_inter=16, layers=3, heads=6, q_lora=20, kv_lora=20, nope=12, rope=6, v=10, experts=6,
                         topk=3, shared=1, first_dense=1, groups=1, topk_group=1, scaling=2.5, norm_topk=True,
                         max_pos=256, rope_parameters=_yarn(8.0, 32, 1.0, 0.5, theta=50000.0), bos=None,
                         eos=TOY_EOS),
                 "pad_token_id": TOY_PAD},
    # zai-org/GLM-5 (744B total, 40B active; from memory): 78 layers (3 dense), 64 heads, q LoRA 2048, KV LoRA 512,
    # qk 192 + 64 rotated, v 256, 256 experts top-8 and a shared one, an MTP layer, the indexer of 32 heads x 128
    # keeping 2048 keys in every layer.
    "glm-5": {**_glm5((32, 128, 2048), 1e-5, vocab=154880, hidden=6144, inter=12288, moe_inter=2048, layers=78,
                      heads=64, q_lora=2048, kv_lora=512, nope=192, rope=64, v=256, experts=256, topk=8, shared=1,
                      first_dense=3, groups=1, topk_group=1, scaling=2.5, norm_topk=True, max_pos=202752,
                      rope_parameters=_default(1000000.0), bos=None, eos=[154820, 154827, 154829]),
              "pad_token_id": 154820, "num_nextn_predict_layers": 1},
}

#: DeepSeek-V3's rules with the indexer's (interleaved RoPE, ``indexer_types``).
GLM5_CONFIG = dsa_config_map(DEEPSEEK_V3_CONFIG, interleaved=True, shared=True, family="GLM-5")

GLM5 = Family(
    name="glm5",
    aliases=("glm_moe_dsa",),
    hf_architectures=("GlmMoeDsaForCausalLM",),
    model_types=("glm_moe_dsa",),
    presets=GLM5_PRESETS,
    tiny="glm5-tiny",
    odd="glm5-odd",
    config_map=GLM5_CONFIG,
    weight_map=dsa_weights,
    layer_spec=dsa_layer_spec,
    test_tokenizer=write_glm4_tokenizer,
    description="GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3.2's MLA, sparse attention (interleaved indexer RoPE, "
                "layers sharing a top-k) and sigmoid-routed experts",
    # Megatron-LM's args tell GLM-5 from DeepSeek-V3.2 only by 0.19's dsa_indexer_rope_interleaved, which the
    # claims (read before a family's own rules) do not see: --family glm5 picks it, as --family kimi-k2 does.
    megatron_lm_rules=(deepseek_megatron_lm.MegatronLmMla("dsa"), deepseek_megatron_lm.MegatronLmIndexer()),
)
