"""A reference Hugging Face implementation of Qwen (v1) (``QWenLMHeadModel``, model_type ``qwen``).

Upstream Qwen-7B ships its model as remote code (``modeling_qwen.py``). pai-zoo never runs remote code, so this
module re-implements it for transformers 5: the same config keys and tensor names (``transformer.wte``,
``transformer.h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.w1 / mlp.w2 / mlp.c_proj``, ``transformer.ln_f``,
``lm_head``), so published checkpoints load as they are, and ``generate`` works with a KV cache and left padding.

The computation follows the published code:

* RMSNorm in float32; attention ``c_attn`` -> ``[q; k; v]`` (bias always), multi-head, scaled by ``1/sqrt(d)``;
* rotary embeddings on the first ``kv_channels * rotary_pct`` channels of each head (halves rotated);
* MLP ``c_proj(w1(x) * silu(w2(x)))`` of width ``intermediate_size // 2``: ``w2`` is the gate;
* at inference on sequences longer than ``seq_length``: dynamic NTK (rotary base scaled by the alpha of the
  prompt length) and log-n query scaling (``use_dynamic_ntk``, ``use_logn_attn``).

Positions: ``position_ids`` when given (``generate`` derives them from the attention mask), else counted from
the cache. Upstream counts from the first (padding) slot instead; rotary attention depends only on position
differences, so the two agree.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from pai_zoo.hf_reference import RMSNorm, causal_lm_output, decoder_inputs, rotate_half

__all__ = ["QWenConfig", "QWenModel", "QWenLMHeadModel"]


class QWenConfig(PreTrainedConfig):
    """Qwen (v1)'s configuration: the published ``configuration_qwen.py`` keys and defaults (Qwen-7B's)."""

    model_type = "qwen"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=151936,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        emb_dropout_prob=0.0,
        attn_dropout_prob=0.0,
        layer_norm_epsilon=1e-6,
        initializer_range=0.02,
        max_position_embeddings=8192,
        scale_attn_weights=True,
        use_cache=True,
        bf16=False,
        fp16=False,
        fp32=False,
        kv_channels=128,
        rotary_pct=1.0,
        rotary_emb_base=10000,
        use_dynamic_ntk=True,
        use_logn_attn=True,
        use_flash_attn="auto",
        intermediate_size=22016,
        no_bias=True,
        tie_word_embeddings=False,
        seq_length=8192,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.emb_dropout_prob = emb_dropout_prob
        self.attn_dropout_prob = attn_dropout_prob
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.scale_attn_weights = scale_attn_weights
        self.use_cache = use_cache
        self.max_position_embeddings = max_position_embeddings
        self.bf16, self.fp16, self.fp32 = bf16, fp16, fp32
        self.kv_channels = kv_channels
        self.rotary_pct = rotary_pct
        self.rotary_emb_base = rotary_emb_base
        self.use_dynamic_ntk = use_dynamic_ntk
        self.use_logn_attn = use_logn_attn
        self.use_flash_attn = use_flash_attn
        self.no_bias = no_bias
        self.seq_length = seq_length
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def _apply_rotary(t, cos, sin):
    """``t`` [b, heads, s, d]; rotates its first ``cos.shape[-1]`` channels."""
    rot = cos.shape[-1]
    t_rot, t_pass = t[..., :rot].float(), t[..., rot:].float()
    t_rot = t_rot * cos + rotate_half(t_rot) * sin
    return torch.cat((t_rot, t_pass), dim=-1).type_as(t)


class QWenAttention(nn.Module):
    def __init__(self, config: QWenConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.projection_size = config.kv_channels * config.num_attention_heads
        self.c_attn = nn.Linear(config.hidden_size, 3 * self.projection_size)
        self.c_proj = nn.Linear(self.projection_size, config.hidden_size, bias=not config.no_bias)
        self.dropout = config.attn_dropout_prob

    def forward(self, hidden_states, cos, sin, attention_mask, logn, cache):
        b, s, _ = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(self.projection_size, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if logn is not None:
            q = q * logn[k.shape[2] - s: k.shape[2]].view(1, 1, s, 1).type_as(q)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = F.dropout(torch.softmax(scores.float(), dim=-1).type_as(q), self.dropout, self.training)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, self.projection_size)
        return self.c_proj(out)


class QWenMLP(nn.Module):
    def __init__(self, config: QWenConfig):
        super().__init__()
        width = config.intermediate_size // 2
        self.w1 = nn.Linear(config.hidden_size, width, bias=not config.no_bias)
        self.w2 = nn.Linear(config.hidden_size, width, bias=not config.no_bias)
        self.c_proj = nn.Linear(width, config.hidden_size, bias=not config.no_bias)

    def forward(self, x):
        return self.c_proj(self.w1(x) * F.silu(self.w2(x)))


class QWenBlock(nn.Module):
    def __init__(self, config: QWenConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.attn = QWenAttention(config, layer_idx)
        self.ln_2 = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = QWenMLP(config)

    def forward(self, hidden_states, cos, sin, attention_mask, logn, cache):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), cos, sin, attention_mask, logn, cache)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class QWenPreTrainedModel(PreTrainedModel):
    config_class = QWenConfig
    config: QWenConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["QWenBlock"]
    _supports_sdpa = False
    _supports_flash_attn = False


class QWenModel(QWenPreTrainedModel):
    def __init__(self, config: QWenConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.drop = nn.Dropout(config.emb_dropout_prob)
        self.h = nn.ModuleList([QWenBlock(config, i) for i in range(config.num_hidden_layers)])
        self.ln_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.rotary_dim = (
            config.kv_channels if config.rotary_pct == 1.0 else int(config.kv_channels * config.rotary_pct)
        )
        self._ntk_alpha = 1.0  # the prompt's NTK alpha, kept for the decoding steps that follow it
        self.post_init()

    def _rotary(self, positions, ntk_alpha: float):
        dim, base = self.rotary_dim, float(self.config.rotary_emb_base)
        base = base * ntk_alpha ** (dim / (dim - 2)) if ntk_alpha != 1.0 else base
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
        freqs = positions.float()[..., None] * inv_freq  # [b, s, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [b, 1, s, dim]
        return emb.cos(), emb.sin()

    def _long_context(self, kv_len: int, new_tokens: int, device):
        """Upstream's inference-time extensions beyond ``seq_length``: the dynamic-NTK alpha and log-n scales."""
        seq_length = self.config.seq_length
        if self.training:
            return 1.0, None
        if kv_len == new_tokens:  # a prompt: alpha from its length, kept for decoding
            alpha = 1.0
            if self.config.use_dynamic_ntk and kv_len > seq_length:
                alpha = max(2 ** math.ceil(math.log(kv_len / seq_length, 2) + 1) - 1, 1)
            self._ntk_alpha = float(alpha)
        logn = None
        if self.config.use_logn_attn and kv_len > seq_length:
            index = torch.arange(1, kv_len + 1, dtype=torch.float64, device=device)
            logn = torch.where(index > seq_length, torch.log(index) / math.log(seq_length), torch.ones_like(index))
        return self._ntk_alpha if self.config.use_dynamic_ntk else 1.0, logn

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, past_key_values=None, **kwargs):
        inputs_embeds, cache, past, position_ids, mask = decoder_inputs(
            self, self.wte, input_ids, inputs_embeds, attention_mask, position_ids,
            cache if cache is not None else past_key_values, use_cache)
        s = inputs_embeds.shape[1]
        alpha, logn = self._long_context(past + s, s, inputs_embeds.device)
        cos, sin = self._rotary(position_ids, alpha)
        hidden_states = self.drop(inputs_embeds)
        for block in self.h:
            hidden_states = block(hidden_states, cos, sin, mask, logn, cache)
        return BaseModelOutputWithPast(last_hidden_state=self.ln_f(hidden_states), cache=cache)


class QWenLMHeadModel(QWenPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: QWenConfig):
        super().__init__(config)
        self.transformer = QWenModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, past_key_values=None, logits_to_keep=0, **kwargs):
        out = self.transformer(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                               use_cache=use_cache)
        return causal_lm_output(self, out.last_hidden_state, self.lm_head, out.cache, labels, logits_to_keep, **kwargs)
