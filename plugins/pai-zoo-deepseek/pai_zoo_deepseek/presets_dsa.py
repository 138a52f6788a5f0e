"""Hugging Face configs of DeepSeek-V3.2 (``deepseek_v32``): the published size (from memory) and tiny ones for
tests. V3.2 is DeepSeek-V3's config plus the indexer's ``index_n_heads``, ``index_head_dim`` and ``index_topk``."""
from __future__ import annotations

from .presets import TOY_BOS, TOY_EOS, _deepseek, _v3_671b, _yarn


def _v32(config: dict, heads: int, dim: int, topk: int) -> dict:
    config = {k: v for k, v in config.items() if k != "rope_interleave"}  # V3.2's config has no such key
    return {**config, "model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
            "index_n_heads": heads, "index_head_dim": dim, "index_topk": topk}


V32_PRESETS = {
    # Tiny V3.2: V3-tiny's shape, 8 indexer heads of 16 channels (8 rotated), top-8 keys. Many heads: a key that
    # every head scores <= 0 scores exactly 0 (ReLU), and torch.topk orders such ties by the row's length (a
    # packed row's record and the record alone may keep different ones, as transformers would).
    "deepseek-v32-tiny": _v32(_deepseek(
        3, vocab=512, hidden=64, inter=96, moe_inter=32, layers=2, heads=4, q_lora=24, kv_lora=16, nope=16,
        rope=8, v=12, experts=4, topk=2, shared=1, first_dense=1, groups=2, topk_group=1, scaling=2.5,
        norm_topk=True, max_pos=256, rope_parameters=_yarn(4.0, 64, 1.0, 1.0), bos=TOY_BOS, eos=TOY_EOS),
        heads=8, dim=16, topk=8),
    # Odd V3.2: 6 heads, hidden 48, vocab 997, 6 experts in 3 groups top-4, YaRN from 32 positions with an
    # attention factor != 1; 3 indexer heads of 10 channels (6 rotated), top-5 keys (the 16-token forward check
    # drops keys from the sixth query on).
    "deepseek-v32-odd": _v32(_deepseek(
        3, vocab=997, hidden=48, inter=80, moe_inter=16, layers=2, heads=6, q_lora=20, kv_lora=20, nope=12,
        rope=6, v=10, experts=6, topk=4, shared=1, first_dense=1, groups=3, topk_group=2, scaling=2.5,
        norm_topk=True, max_pos=256, rope_parameters=_yarn(8.0, 32, 1.0, 0.5), bos=TOY_BOS, eos=TOY_EOS),
        heads=3, dim=10, topk=5),
    # DeepSeek-V3.2-Exp and DeepSeek-V3.2 (from memory): DeepSeek-V3's 671B architecture (MTP layer, FP8 blocks)
    # with 64 indexer heads of 128 channels and top-2048 keys.
    "deepseek-v32-exp": _v32(_v3_671b(), heads=64, dim=128, topk=2048),
    "deepseek-v32-671b": _v32(_v3_671b(), heads=64, dim=128, topk=2048),
}
