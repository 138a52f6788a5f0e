"""Hugging Face configs of the published EXAONE 4.0 sizes, plus tiny and odd ones for tests.

The published values are written from the ``config.json`` files of the Hugging Face repositories named beside each
preset, FROM MEMORY: they were not checked against the files here (no network). Values marked ``# unverified`` are
the least certain. Token ids: EXAONE 4.0's tokenizer has ``[PAD]`` 0, ``[BOS]`` 1 and ``[|endofturn|]`` 361 (the
EOS). The test presets use the test tokenizer's ids (:mod:`pai_zoo_exaone.tokenizer_files`).
"""
from __future__ import annotations

EXAONE_TOKENS = {"bos_token_id": 1, "eos_token_id": 361, "pad_token_id": 0}
#: The test tokenizer's ids ([PAD] 0, [BOS] 1, [|endofturn|] 4).
TOY_TOKENS = {"bos_token_id": 1, "eos_token_id": 4, "pad_token_id": 0}

SLIDING, FULL = "sliding_attention", "full_attention"

#: EXAONE 4.0's long-context RoPE: llama3 scaling, factor 16 over 8192 positions, base 1e6.  # unverified
EXAONE_ROPE = {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def pattern_layers(pattern: str, layers: int) -> list[str]:
    """``layer_types`` of a ``sliding_window_pattern`` string ("L" sliding, "G" full), repeated from layer 0."""
    return [SLIDING if pattern[i % len(pattern)] == "L" else FULL for i in range(layers)]


def _exaone4(hidden, inter, layers, heads, kv, head_dim, *, vocab=102400, max_pos=131072, window=4096,
             pattern="LLLG", rope=None, eps=1e-5, tie=False, tokens=EXAONE_TOKENS, **extra):
    """EXAONE 4.0: norms after attention and MLP, per-head q/k norms, three sliding-window layers with RoPE to one
    full layer without (``pattern``); ``window=None``: every layer full, all with RoPE (transformers then needs
    ``layer_types``)."""
    types = pattern_layers(pattern, layers) if window is not None else [FULL] * layers
    out = dict(
        model_type="exaone4", architectures=["Exaone4ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters=dict(rope or EXAONE_ROPE), attention_dropout=0.0, sliding_window=window,
        layer_types=types, tie_word_embeddings=tie, **tokens, **extra,
    )
    if window is not None:
        out["sliding_window_pattern"] = pattern
    return out


PRESETS = {
    # EXAONE-4.0-32B-shaped: 4 layers "LLLG" (three sliding layers of window 6, shorter than the suite's sequences,
    # then a full one without RoPE), GQA, head_dim 24 != 64 / 4, a tied head, vocabulary 509 (no multiple of 128;
    # the test tokenizer has at most 480 tokens), llama3 RoPE scaling over 64 positions.
    "exaone4-tiny": _exaone4(64, 96, 4, 4, 2, 24, vocab=509, max_pos=512, window=6, tie=True, tokens=TOY_TOKENS,
                             rope={**EXAONE_ROPE, "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64}),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, window 5, 4 layers "GL" (a full layer first: no RoPE from layer 0 on), rms_norm_eps 1e-6,
    # rope theta 50000 without scaling, 300 positions, an untied head.
    "exaone4-odd": _exaone4(48, 80, 4, 6, 2, 20, vocab=997, max_pos=300, window=5, pattern="GL", eps=1e-6,
                            tokens=TOY_TOKENS, rope={"rope_type": "default", "rope_theta": 50000.0}),
    # LGAI-EXAONE/EXAONE-4.0-1.2B: global attention only (no window), RoPE on every layer, a tied head
    "exaone-4.0-1.2b": _exaone4(2048, 4096, 30, 32, 8, 64, max_pos=65536, window=None, tie=True),
    # LGAI-EXAONE/EXAONE-4.0-32B: "LLLG", window 4096
    "exaone-4.0-32b": _exaone4(5120, 27392, 64, 40, 8, 128),
}
