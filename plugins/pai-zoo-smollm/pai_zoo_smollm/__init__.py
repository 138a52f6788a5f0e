"""pai-zoo plugin for SmolLM3 (``SmolLM3ForCausalLM``), written against pai-zoo's public API only.

SmolLM3 is the Llama layout (RMSNorm, SwiGLU, GQA, a tied head by default) in which some layers skip the rotary
embedding: ``no_rope_layers`` (1 = RoPE) or, when absent, every ``no_rope_layer_interval``-th layer. The core rule
:class:`pai_zoo.plugin.no_rope.NoRopeLayers` gives megatron-core's ``no_rope_freq``. With ``use_sliding_window``
the no-RoPE layers (``layer_types`` ``sliding_attention``) attend within ``sliding_window`` tokens: megatron-core's
``window_size`` with per-layer ``window_attn_skip_freq`` (:class:`Windows`).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Family,
    Field,
    Require,
    Rope,
    Rule,
    hookimpl,
)
from pai_zoo.config_map import FAMILY_KEY_PREFIX
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_table
from pai_zoo.plugin.no_rope import NoRopeLayers, interval_layers

from .presets import PRESETS

SLIDING, FULL = "sliding_attention", "full_attention"
#: arch keys of the source config's ``use_sliding_window`` and ``sliding_window`` (written back as they were).
USE_WINDOW, WINDOW = FAMILY_KEY_PREFIX + "use_sliding_window", FAMILY_KEY_PREFIX + "sliding_window"


class Windows(Rule):
    """``use_sliding_window``, ``sliding_window`` w and ``layer_types`` <-> ``window_size`` ``[w - 1, 0]`` and
    ``window_attn_skip_freq`` (1 on the ``sliding_attention`` layers). Absent ``layer_types`` are derived as
    SmolLM3Config derives them: sliding on the no-RoPE layers when ``use_sliding_window`` and a window are set."""

    hf_keys = ("use_sliding_window", "sliding_window", "layer_types")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        use, window, n = hf.get("use_sliding_window", False), hf.get("sliding_window"), hf["num_hidden_layers"]
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigTranslationError(f"config.json has sliding_window={window!r}; it must be a positive integer "
                                         "or null")
        types = hf.get("layer_types")
        if types is None:
            ropes = hf.get("no_rope_layers") or interval_layers(hf.get("no_rope_layer_interval", 4), n)
            types = [SLIDING if use and window is not None and not rope else FULL for rope in ropes]
        if not isinstance(types, (list, tuple)) or len(types) != n or not set(types) <= {SLIDING, FULL}:
            raise ConfigTranslationError(f"config.json has layer_types={types!r}; SmolLM3 needs one entry per layer "
                                         f"(num_hidden_layers={n}), each {SLIDING!r} or {FULL!r}")
        if SLIDING in types and (not use or window is None):
            raise ConfigTranslationError(
                f"config.json's layer_types has {SLIDING!r} with use_sliding_window={use!r}, "
                f"sliding_window={window!r}; a sliding layer needs use_sliding_window true and a window "
                "(transformers' attention kernels disagree otherwise)")
        arch[USE_WINDOW], arch[WINDOW] = use, window
        if SLIDING in types:
            arch["window_size"] = [window - 1, 0]
            arch["window_attn_skip_freq"] = [1 if t == SLIDING else 0 for t in types]

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["use_sliding_window"] = arch.get(USE_WINDOW, False)
        hf["sliding_window"] = arch.get(WINDOW)
        flags = arch.get("window_attn_skip_freq") or [0] * arch["num_layers"]
        hf["layer_types"] = [SLIDING if flag else FULL for flag in flags]

    def describe(self) -> str:
        return ("use_sliding_window, sliding_window w, layer_types -> window_size [w - 1, 0], window_attn_skip_freq "
                "(1 = sliding layer)")


CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_bias", "add_qkv_bias", default=False),
        Field("mlp_bias", "add_bias_linear", default=False),
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        NoRopeLayers(default_interval=4),
        Windows(),
        Require(lambda hf: hf.get("attention_bias", False) == hf.get("mlp_bias", False),
                "megatron-core has one bias switch for o_proj and the MLP: attention_bias and mlp_bias must be equal"),
        head_dim=None,  # SmolLM3Config has no head_dim field; a given one is read (getattr) as hidden / heads' stand-in
        tie_default=True,
    ),
    passthrough=("pretraining_tp", "max_window_layers"),  # published config extras transformers' SmolLM3 never reads
)

L, M = HF_LAYER, MCORE_LAYER


#: The Llama table with the bias rows the config switches on.
weights = llama_table


def _write_toy_tokenizer(folder) -> None:
    from pai_zoo_llama.tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


SMOLLM3 = Family(
    name="smollm3",
    aliases=("smollm",),
    hf_architectures=("SmolLM3ForCausalLM",),
    model_types=("smollm3",),
    presets=PRESETS,
    tiny="smollm3-tiny",
    odd="smollm3-odd",
    config_map=CONFIG,
    weight_map=weights,
    test_tokenizer=_write_toy_tokenizer,
    description="SmolLM3 (SmolLM3ForCausalLM: SmolLM3-3B; layers without RoPE)",
)


@hookimpl
def pai_zoo_families():
    return [SMOLLM3]
