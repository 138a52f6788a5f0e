"""A compact reference implementation of ChatGLM2/ChatGLM3-6B for transformers 5 (the published model is remote
code, which pai-zoo never runs).

Tensor names and config keys are those of THUDM's ``modeling_chatglm.py`` / ``configuration_chatglm.py``:
``transformer.embedding.word_embeddings``, ``transformer.encoder.layers.{i}.{input_layernorm, self_attention.
query_key_value, self_attention.dense, post_attention_layernorm, mlp.dense_h_to_4h, mlp.dense_4h_to_h}``,
``transformer.encoder.final_layernorm``, ``transformer.output_layer``. The maths follows the published code:

* fused ``query_key_value`` = ``[q (all heads); k (all groups); v (all groups)]``; groups are shared by consecutive
  query heads (``multi_query_attention`` with ``multi_query_group_num`` groups, else one per head);
* rotary embeddings on the first ``kv_channels / 2`` channels of each head, rotating interleaved pairs
  ``(x[2i], x[2i+1])`` by ``position / (10000 * rope_ratio) ** (2i / (kv_channels / 2))``;
* ``dense_h_to_4h`` = ``[gate; up]``, ``silu(gate) * up`` (``swiglu``); RMSNorm (``rmsnorm``), pre-norm residuals.

``transformer.rotary_pos_emb.inv_freq`` (a buffer of the published checkpoints) is recomputed from the config,
so this model has no such tensor. The key/value cache is transformers' ``DynamicCache``; ``generate`` derives
position ids from the attention mask (left padding), as the published tokenizer's ``position_ids`` do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["ChatGLMConfig", "ChatGLMForConditionalGeneration", "ChatGLMModel"]


class ChatGLMConfig(PretrainedConfig):
    """THUDM's ``ChatGLMConfig`` (same keys and defaults as chatglm3-6b's ``configuration_chatglm.py``)."""

    model_type = "chatglm"
    attribute_map = {"num_hidden_layers": "num_layers", "vocab_size": "padded_vocab_size"}

    def __init__(
        self, num_layers=28, padded_vocab_size=65024, hidden_size=4096, ffn_hidden_size=13696, kv_channels=128,
        num_attention_heads=32, seq_length=2048, hidden_dropout=0.0, classifier_dropout=None, attention_dropout=0.0,
        layernorm_epsilon=1e-5, rmsnorm=True, apply_residual_connection_post_layernorm=False, post_layer_norm=True,
        add_bias_linear=False, add_qkv_bias=False, bias_dropout_fusion=True, multi_query_attention=False,
        multi_query_group_num=1, rope_ratio=1, apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True,
        fp32_residual_connection=False, quantization_bit=0, pre_seq_len=None, prefix_projection=False,
        tie_word_embeddings=False, **kwargs,
    ):
        self.num_layers = num_layers
        self.padded_vocab_size = padded_vocab_size
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.kv_channels = kv_channels
        self.num_attention_heads = num_attention_heads
        self.seq_length = seq_length
        self.hidden_dropout = hidden_dropout
        self.classifier_dropout = classifier_dropout
        self.attention_dropout = attention_dropout
        self.layernorm_epsilon = layernorm_epsilon
        self.rmsnorm = rmsnorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.post_layer_norm = post_layer_norm
        self.add_bias_linear = add_bias_linear
        self.add_qkv_bias = add_qkv_bias
        self.bias_dropout_fusion = bias_dropout_fusion
        self.multi_query_attention = multi_query_attention
        self.multi_query_group_num = multi_query_group_num
        self.rope_ratio = rope_ratio
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        self.attention_softmax_in_fp32 = attention_softmax_in_fp32
        self.fp32_residual_connection = fp32_residual_connection
        self.quantization_bit = quantization_bit
        self.pre_seq_len = pre_seq_len
        self.prefix_projection = prefix_projection
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def num_key_value_groups(self) -> int:
        return self.multi_query_group_num if self.multi_query_attention else self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (self.weight * (x.float() * torch.rsqrt(variance + self.eps))).to(x.dtype)


def _norm(config):
    if config.rmsnorm:
        return RMSNorm(config.hidden_size, eps=config.layernorm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)


class RotaryEmbedding(nn.Module):
    """cos/sin of ``position * theta_i`` for the rotary half of each head (no stored tensors)."""

    def __init__(self, config):
        super().__init__()
        head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.dim = head_dim // 2
        self.base = 10000.0 * config.rope_ratio

    def forward(self, position_ids):
        theta = 1.0 / (
            self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=position_ids.device) / self.dim)
        )
        angles = position_ids.float()[..., None] * theta  # [b, s, dim/2]
        return torch.cos(angles), torch.sin(angles)


def apply_rotary(x, cos, sin):
    """x: [b, s, heads, head_dim]; rotate interleaved pairs of the first 2 * cos.shape[-1] channels."""
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    pairs = x_rot.float().reshape(*x_rot.shape[:-1], -1, 2)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    rotated = torch.stack([pairs[..., 0] * c - pairs[..., 1] * s, pairs[..., 1] * c + pairs[..., 0] * s], dim=-1)
    return torch.cat([rotated.flatten(-2).to(x.dtype), x_pass], dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.groups = config.num_key_value_groups
        self.sizes = [self.heads * self.head_dim, self.groups * self.head_dim, self.groups * self.head_dim]
        self.query_key_value = nn.Linear(config.hidden_size, sum(self.sizes),
                                         bias=config.add_bias_linear or config.add_qkv_bias)
        self.dense = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=config.add_bias_linear)
        self.dropout = config.attention_dropout

    def forward(self, x, mask, cos, sin, cache):
        b, s, _ = x.shape
        q, k, v = self.query_key_value(x).split(self.sizes, dim=-1)
        q = apply_rotary(q.view(b, s, self.heads, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rotary(k.view(b, s, self.groups, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        k = k.repeat_interleave(self.heads // self.groups, dim=1)
        v = v.repeat_interleave(self.heads // self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.dense(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, 2 * config.ffn_hidden_size, bias=config.add_bias_linear)
        self.dense_4h_to_h = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=config.add_bias_linear)

    def forward(self, x):
        gate, up = self.dense_h_to_4h(x).chunk(2, dim=-1)  # the published swiglu
        return self.dense_4h_to_h(F.silu(gate) * up)


class GLMBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.post_ln_residual = config.apply_residual_connection_post_layernorm
        self.input_layernorm = _norm(config)
        self.self_attention = SelfAttention(config, layer_idx)
        self.post_attention_layernorm = _norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x, mask, cos, sin, cache):
        normed = self.input_layernorm(x)
        x = (normed if self.post_ln_residual else x) + self.dropout(self.self_attention(normed, mask, cos, sin, cache))
        normed = self.post_attention_layernorm(x)
        return (normed if self.post_ln_residual else x) + self.dropout(self.mlp(normed))


class Embedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)

    def forward(self, input_ids):
        return self.word_embeddings(input_ids)


class GLMTransformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(GLMBlock(config, i) for i in range(config.num_layers))
        self.final_layernorm = _norm(config) if config.post_layer_norm else None

    def forward(self, x, mask, cos, sin, cache):
        for layer in self.layers:
            x = layer(x, mask, cos, sin, cache)
        return self.final_layernorm(x) if self.final_layernorm is not None else x


class ChatGLMPreTrainedModel(PreTrainedModel):
    config_class = ChatGLMConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["GLMBlock"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


class ChatGLMModel(ChatGLMPreTrainedModel):
    """``transformer``: embedding, rotary embedding, encoder, output layer (as published, inside this module)."""

    def __init__(self, config):
        super().__init__(config)
        self.embedding = Embedding(config)
        self.rotary_pos_emb = RotaryEmbedding(config)
        self.encoder = GLMTransformer(config)
        self.output_layer = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embedding.word_embeddings

    def set_input_embeddings(self, value):
        self.embedding.word_embeddings = value

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None):
        b, s = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + s, device=input_ids.device).expand(b, s)
        cos, sin = self.rotary_pos_emb(position_ids)
        query = torch.arange(past, past + s, device=input_ids.device)[:, None]
        allowed = (torch.arange(past + s, device=input_ids.device)[None, :] <= query).expand(b, 1, s, past + s)
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, -(past + s):]
        # A padding query sees no key at all: let it see everything (its output is never used), as the published
        # get_masks does, so that softmax stays finite.
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        hidden = self.encoder(self.embedding(input_ids), allowed, cos, sin, cache)
        return hidden


class ChatGLMForConditionalGeneration(ChatGLMPreTrainedModel, GenerationMixin):
    """The causal LM (``architectures: ["ChatGLMModel"]`` in the published config.json)."""

    def __init__(self, config):
        super().__init__(config)
        self.transformer = ChatGLMModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.embedding.word_embeddings

    def get_output_embeddings(self):
        return self.transformer.output_layer

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, labels=None,
                return_dict=None, **kwargs):
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        hidden = self.transformer(input_ids, attention_mask, position_ids, cache)
        logits = self.transformer.output_layer(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)
