"""pai-zoo plugin for Baichuan and Baichuan2: fused ``W_pack`` QKV, SwiGLU, RMSNorm, no biases; RoPE (7B) or
ALiBi (13B); Baichuan2's normalised output head (NormHead)."""
from __future__ import annotations

from dataclasses import dataclass

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Dropped,
    Family,
    Field,
    FusedQKV,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import FAMILY_KEY_PREFIX, Rule
from pai_zoo.family import LazyClass
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_layout
from pai_zoo.mcore.alibi import ALIBI

from .presets import PRESETS
from .tokenizer_files import write_test_tokenizer

#: arch key: Baichuan2's NormHead (read by the family's model_class).
NORM_HEAD = FAMILY_KEY_PREFIX + "norm_head"
#: arch key: a RoPE config's ``model_max_length`` (Baichuan2-7B carries it beside max_position_embeddings).
MODEL_MAX_LENGTH = FAMILY_KEY_PREFIX + "model_max_length"
ROPE_BASE = 10000.0  # fixed in the published modeling_baichuan.py


@dataclass
class BaichuanPositions(Rule):
    """RoPE when ``max_position_embeddings`` is set (Baichuan-7B, Baichuan2-7B), ALiBi when only
    ``model_max_length`` is (Baichuan-13B, Baichuan2-13B), as the published configs tell them apart."""

    hf_keys: tuple[str, ...] = ("max_position_embeddings", "model_max_length")

    def describe(self) -> str:
        return ("max_position_embeddings set -> RoPE (base 10000), max_sequence_length; "
                "else model_max_length -> ALiBi, max_sequence_length")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        max_pos, max_len = hf.get("max_position_embeddings"), hf.get("model_max_length")
        if max_pos is not None:
            arch.update(position_embedding_type="rope", rotary_base=ROPE_BASE, max_sequence_length=max_pos)
            if max_len is not None:
                arch[MODEL_MAX_LENGTH] = max_len
        elif max_len is not None:
            arch.update(position_embedding_type=ALIBI, max_sequence_length=max_len)
        else:
            raise ConfigTranslationError(
                "config.json has neither max_position_embeddings (RoPE: Baichuan-7B, Baichuan2-7B) "
                "nor model_max_length (ALiBi: Baichuan-13B, Baichuan2-13B)")

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("position_embedding_type") == ALIBI:
            hf.update(max_position_embeddings=None, model_max_length=arch["max_sequence_length"])
        elif arch.get("position_embedding_type") == "rope":
            if arch.get("rotary_base", ROPE_BASE) != ROPE_BASE:
                raise ConfigTranslationError(f"Baichuan's RoPE base is {ROPE_BASE}, not {arch['rotary_base']}")
            hf.update(max_position_embeddings=arch["max_sequence_length"], model_max_length=arch.get(MODEL_MAX_LENGTH))
        else:
            raise ConfigTranslationError(f"Baichuan has RoPE or ALiBi, not {arch.get('position_embedding_type')!r}")


CONFIG = ConfigMap(
    *llama_config_rules(
        Field("norm_head", NORM_HEAD, default=False),
        BaichuanPositions(),
        gqa=False, max_positions=False, tie_default=False,
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False},
    ),
    # z_loss_weight: an auxiliary training loss of Baichuan2's code; gradient_checkpointing: a memory setting.
    passthrough=("z_loss_weight", "gradient_checkpointing", "_from_model_config"),
)

L, M = HF_LAYER, MCORE_LAYER


def weights(config) -> WeightMap:
    """Baichuan's table. ``lm_head.weight`` is the stored (un-normalised) weight in both directions: the
    NormHead normalises it in the forward pass on each side, so the round trip is bit-identical."""
    rows = llama_layout(qkv=FusedQKV(L + "self_attn.W_pack.weight", M + "self_attention.linear_qkv.weight"))
    if config.get("position_embedding_type") == "rope":
        rows.append(Dropped(L + "self_attn.rotary_emb.inv_freq"))  # a buffer older checkpoints saved
    return WeightMap(*rows)


def _model_class(config):
    from pai_zoo.mcore.build import model_base

    if not config.get(NORM_HEAD):
        return model_base()
    from .mcore import norm_head_gpt_model

    return norm_head_gpt_model()


BAICHUAN = Family(
    name="baichuan",
    aliases=("baichuan2",),
    hf_architectures=("BaiChuanForCausalLM", "BaichuanForCausalLM"),
    model_types=("baichuan",),
    presets=PRESETS,
    tiny="baichuan-tiny",
    odd="baichuan-odd",
    config_map=CONFIG,
    weight_map=weights,
    model_class=_model_class,
    hf_model_class=LazyClass("pai_zoo_baichuan.modeling_baichuan:BaichuanForCausalLM"),
    hf_config_class=LazyClass("pai_zoo_baichuan.modeling_baichuan:BaichuanConfig"),
    test_tokenizer=write_test_tokenizer,
    description="Baichuan and Baichuan2, 7B (RoPE) and 13B (ALiBi), NormHead",
)


@hookimpl
def pai_zoo_families():
    return [BAICHUAN]
