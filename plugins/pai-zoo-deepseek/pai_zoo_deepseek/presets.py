"""Hugging Face configs of the published DeepSeek-V2/V3 checkpoints (their config.json values; the ones not
checked against a published file are listed in the README), plus tiny ones for tests.

DeepSeek-V3 and R1 carry their published multi-token-prediction layer (``num_nextn_predict_layers: 1``) and FP8
``quantization_config``; the tiny presets have neither (their transformers-saved files could not hold MTP layers).
"""
from __future__ import annotations

from pai_zoo.quantization import FP8_BLOCK_128

#: <｜begin▁of▁sentence｜> / <｜end▁of▁sentence｜> of the test tokenizer (ids 0 and 1, as DeepSeek-V3's).
TOY_BOS, TOY_EOS = 0, 1


def _yarn(factor, original, mscale, mscale_all_dim, theta=10000.0, beta_fast=32, beta_slow=1):
    return {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": mscale, "mscale_all_dim": mscale_all_dim}


def _deepseek(version, *, vocab, hidden, inter, moe_inter, layers, heads, q_lora, kv_lora, nope, rope, v,
              experts, topk, shared, first_dense, groups, topk_group, scaling, norm_topk, max_pos, rope_parameters,
              bos, eos, topk_method="greedy"):
    config = dict(
        model_type=f"deepseek_v{version}", architectures=[f"DeepseekV{version}ForCausalLM"], vocab_size=vocab,
        hidden_size=hidden, intermediate_size=inter, moe_intermediate_size=moe_inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=q_lora, kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, n_routed_experts=experts,
        num_experts_per_tok=topk, n_shared_experts=shared, first_k_dense_replace=first_dense, n_group=groups,
        topk_group=topk_group, routed_scaling_factor=scaling, norm_topk_prob=norm_topk,
        max_position_embeddings=max_pos, rms_norm_eps=1e-6, rope_parameters=rope_parameters, hidden_act="silu",
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, bos_token_id=bos, eos_token_id=eos,
    )
    if version == 2:
        config.update(topk_method=topk_method, mlp_bias=False)
    else:
        config.update(num_nextn_predict_layers=0, rope_interleave=True)
    return config


def _published(config, *, scoring, topk_method, aux_loss_alpha, seq_aux):
    """The published config.json's keys for DeepSeek's own (remote) modeling code that transformers keeps as
    extras: the score function and top-k method (one value supported each), the MoE layer frequency (1), and
    the training-only aux-loss settings and expert-parallel size (no effect on the logits)."""
    return {**config, "scoring_func": scoring, "topk_method": topk_method, "moe_layer_freq": 1, "ep_size": 1,
            "aux_loss_alpha": aux_loss_alpha, "seq_aux": seq_aux}




def _v3_671b():
    return {**_published(_deepseek(
        3, vocab=129280, hidden=7168, inter=18432, moe_inter=2048, layers=61, heads=128, q_lora=1536,
        kv_lora=512, nope=128, rope=64, v=128, experts=256, topk=8, shared=1, first_dense=3, groups=8,
        topk_group=4, scaling=2.5, norm_topk=True, max_pos=163840, rope_parameters=_yarn(40, 4096, 1.0, 1.0),
        bos=0, eos=1), scoring="sigmoid", topk_method="noaux_tc", aux_loss_alpha=0.001, seq_aux=True),
        "num_nextn_predict_layers": 1, "quantization_config": dict(FP8_BLOCK_128)}


DEEPSEEK_PRESETS = {
    # Tiny V2: q LoRA, default RoPE, one dense layer then MoE, group_limited_greedy: the best of 2 groups of 3
    # experts, top-2 in it (a group scored by its top 2 would route otherwise).
    "deepseek-v2-tiny": _deepseek(
        2, vocab=512, hidden=64, inter=96, moe_inter=32, layers=2, heads=4, q_lora=24, kv_lora=16, nope=16,
        rope=8, v=12, experts=6, topk=2, shared=1, first_dense=1, groups=2, topk_group=1, scaling=16.0,
        norm_topk=False, max_pos=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos=TOY_BOS, eos=TOY_EOS, topk_method="group_limited_greedy"),
    # Odd V2: no q LoRA, 6 heads, v_head_dim != qk_nope_head_dim, 5 experts top-3 (softmax, greedy, not
    # renormalised), YaRN with an attention factor != 1 (mscale != mscale_all_dim), vocab 1001.
    "deepseek-v2-odd": _deepseek(
        2, vocab=1001, hidden=48, inter=80, moe_inter=24, layers=2, heads=6, q_lora=None, kv_lora=20, nope=12,
        rope=6, v=10, experts=5, topk=3, shared=2, first_dense=1, groups=1, topk_group=1, scaling=1.5,
        norm_topk=False, max_pos=256, rope_parameters=_yarn(8.0, 32, 0.9, 0.6), bos=TOY_BOS, eos=TOY_EOS),
    # Tiny V3: q LoRA, YaRN, one dense layer then MoE, sigmoid routing in 2 groups with expert bias.
    "deepseek-v3-tiny": _deepseek(
        3, vocab=512, hidden=64, inter=96, moe_inter=32, layers=2, heads=4, q_lora=24, kv_lora=16, nope=16,
        rope=8, v=12, experts=4, topk=2, shared=1, first_dense=1, groups=2, topk_group=1, scaling=2.5,
        norm_topk=True, max_pos=256, rope_parameters=_yarn(4.0, 64, 1.0, 1.0), bos=TOY_BOS, eos=TOY_EOS),
    # Odd V3: no q LoRA, 6 heads, hidden 48, vocab 997, 6 experts in 3 groups (2 chosen) top-4, YaRN whose
    # attention factor is != 1.
    "deepseek-v3-odd": _deepseek(
        3, vocab=997, hidden=48, inter=80, moe_inter=16, layers=2, heads=6, q_lora=None, kv_lora=20, nope=12,
        rope=6, v=10, experts=6, topk=4, shared=1, first_dense=1, groups=3, topk_group=2, scaling=2.5,
        norm_topk=True, max_pos=256, rope_parameters=_yarn(8.0, 32, 1.0, 0.5), bos=TOY_BOS, eos=TOY_EOS),
    "deepseek-v2-lite": _published(_deepseek(
        2, vocab=102400, hidden=2048, inter=10944, moe_inter=1408, layers=27, heads=16, q_lora=None, kv_lora=512,
        nope=128, rope=64, v=128, experts=64, topk=6, shared=2, first_dense=1, groups=1, topk_group=1,
        scaling=1.0, norm_topk=False, max_pos=163840, rope_parameters=_yarn(40, 4096, 0.707, 0.707),
        bos=100000, eos=100001), scoring="softmax", topk_method="greedy", aux_loss_alpha=0.001, seq_aux=True),
    "deepseek-v2-236b": _published(_deepseek(
        2, vocab=102400, hidden=5120, inter=12288, moe_inter=1536, layers=60, heads=128, q_lora=1536, kv_lora=512,
        nope=128, rope=64, v=128, experts=160, topk=6, shared=2, first_dense=1, groups=8, topk_group=3,
        scaling=16.0, norm_topk=False, max_pos=163840, rope_parameters=_yarn(40, 4096, 0.707, 0.707),
        bos=100000, eos=100001, topk_method="group_limited_greedy"),
        scoring="softmax", topk_method="group_limited_greedy", aux_loss_alpha=0.003, seq_aux=True),
    "deepseek-v3-671b": _v3_671b(),
    "deepseek-r1": _v3_671b(),  # DeepSeek-R1 (and R1-0528): DeepSeek-V3's architecture and config.json
}


def _kimi(config, **changes):
    """A DeepSeek-V3 config as Kimi-K2 publishes it: ``model_type`` ``kimi_k2``, one expert group."""
    return {**config, "model_type": "kimi_k2", **changes}


#: Kimi-K2's test tokenizer (:mod:`pai_zoo_deepseek.kimi_tokenizer`): 400 ranks, then [BOS] 400 and [EOS] 401.
KIMI_TOY_BOS, KIMI_TOY_EOS = 400, 401


def _kimi_k2(max_pos, factor):
    """Kimi-K2 (1T total, 32B active; from memory): 61 layers, the first dense, 384 experts top-8 in one group,
    one shared expert, 64 heads, routed scaling 2.827, YaRN from 4096 positions with beta 1/1, RoPE base 50000,
    vocabulary 163840 ([BOS] 163584, [EOS] 163585), published as FP8 blocks of 128."""
    return _kimi(_published(_deepseek(
        3, vocab=163840, hidden=7168, inter=18432, moe_inter=2048, layers=61, heads=64, q_lora=1536, kv_lora=512,
        nope=128, rope=64, v=128, experts=384, topk=8, shared=1, first_dense=1, groups=1, topk_group=1,
        scaling=2.827, norm_topk=True, max_pos=max_pos,
        rope_parameters=_yarn(factor, 4096, 1.0, 1.0, theta=50000.0, beta_fast=1.0, beta_slow=1.0),
        bos=163584, eos=163585), scoring="sigmoid", topk_method="noaux_tc", aux_loss_alpha=0.001, seq_aux=True),
        quantization_config=dict(FP8_BLOCK_128))


KIMI_PRESETS = {
    # Tiny Kimi-K2: q LoRA, YaRN with Kimi's betas, one dense layer then MoE, 4 experts top-2 in one group (no
    # grouped routing), routed scaling 2.827.
    "kimi-k2-tiny": _kimi(_deepseek(
        3, vocab=672, hidden=64, inter=96, moe_inter=32, layers=2, heads=4, q_lora=24, kv_lora=16, nope=16,
        rope=8, v=12, experts=4, topk=2, shared=1, first_dense=1, groups=1, topk_group=1, scaling=2.827,
        norm_topk=True, max_pos=512,
        rope_parameters=_yarn(4.0, 64, 1.0, 1.0, theta=50000.0, beta_fast=1.0, beta_slow=1.0),
        bos=KIMI_TOY_BOS, eos=KIMI_TOY_EOS)),
    # Odd Kimi-K2: 6 heads, hidden 48, vocab 701, v_head_dim != qk_nope_head_dim, 6 experts top-3, 3 layers (the
    # first dense), YaRN from 32 positions (the forward check reaches past it) with an attention factor != 1.
    "kimi-k2-odd": _kimi(_deepseek(
        3, vocab=701, hidden=48, inter=80, moe_inter=16, layers=3, heads=6, q_lora=20, kv_lora=20, nope=12,
        rope=6, v=10, experts=6, topk=3, shared=1, first_dense=1, groups=1, topk_group=1, scaling=2.827,
        norm_topk=True, max_pos=512,
        rope_parameters=_yarn(8.0, 32, 1.0, 0.5, theta=50000.0, beta_fast=1.0, beta_slow=1.0),
        bos=KIMI_TOY_BOS, eos=KIMI_TOY_EOS)),
    "kimi-k2-1t": _kimi_k2(131072, 32.0),  # Kimi-K2-Base / Kimi-K2-Instruct (from memory)
    "kimi-k2-instruct-0905": _kimi_k2(262144, 64.0),  # Kimi-K2-Instruct-0905: 256K context (from memory)
}
