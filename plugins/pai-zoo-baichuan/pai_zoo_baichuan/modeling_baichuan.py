"""A reference Hugging Face implementation of Baichuan and Baichuan2 (model_type ``baichuan``).

Upstream ships the model as remote code (``BaiChuanForCausalLM`` for Baichuan-7B, ``BaichuanForCausalLM``
for Baichuan-13B and Baichuan2). pai-zoo never runs remote code, so this module re-implements it for
transformers 5 with the published config keys and tensor names (``model.embed_tokens``,
``model.layers.{i}.input_layernorm / self_attn.W_pack / self_attn.o_proj / post_attention_layernorm /
mlp.gate_proj / mlp.up_proj / mlp.down_proj``, ``model.norm``, ``lm_head``), so published checkpoints load
as they are, and ``generate`` works with a KV cache and a left-padded batch.

Two position schemes, told apart by the config as the published configs do:

* **RoPE** (Baichuan-7B, Baichuan2-7B: ``max_position_embeddings`` is set): rotary embeddings on whole
  heads, halves rotated, base 10000, at ``position_ids`` (``generate`` derives them from the mask).
* **ALiBi** (Baichuan-13B, Baichuan2-13B: no ``max_position_embeddings``, only ``model_max_length``):
  ``slope_h * j`` added to the scores of key ``j``, slopes by the published formula
  (:func:`pai_zoo.mcore.alibi.alibi_slopes`). Padded keys are masked (as Baichuan2-13B does; Baichuan-13B's
  code ignored padding).

Baichuan2's **NormHead** (``norm_head``, a pai-zoo config key; true for Baichuan2): the output head
multiplies by its weight normalised to unit L2 norm per row. Upstream normalises ``lm_head.weight`` in
place on its first eval forward; here it is normalised in every forward and never written back, so the
stored weight stays exactly what the checkpoint holds (and what converts to megatron-core and back).
Unset, ``norm_head`` is inferred: Baichuan2's configs carry ``z_loss_weight``, Baichuan 1's do not.

RMSNorm in float32; SwiGLU ``down(silu(gate(x)) * up(x))``; no biases.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from pai_zoo.hf_reference import RMSNorm, causal_lm_output, decoder_inputs, rotate_half
from pai_zoo.mcore.alibi import alibi_slopes

__all__ = ["BaichuanConfig", "BaichuanModel", "BaichuanForCausalLM"]

ROPE_BASE = 10000.0  # fixed in the published modeling_baichuan.py


class BaichuanConfig(PreTrainedConfig):
    """Baichuan's configuration: the published keys (Baichuan-7B's and Baichuan2's ``configuration_baichuan.py``)
    plus ``norm_head``. RoPE when ``max_position_embeddings`` is set, else ALiBi."""

    model_type = "baichuan"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=64000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        hidden_act="silu",
        max_position_embeddings=None,
        model_max_length=None,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        norm_head=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.model_max_length = model_max_length
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.norm_head = ("z_loss_weight" in kwargs) if norm_head is None else bool(norm_head)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def uses_alibi(self) -> bool:
        return self.max_position_embeddings is None


class BaichuanAttention(nn.Module):
    def __init__(self, config: BaichuanConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.W_pack = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, rotary, bias, cache):
        b, s, _ = hidden_states.shape
        q, k, v = self.W_pack(hidden_states).split(self.hidden_size, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:
            cos, sin = rotary
            q = (q.float() * cos + rotate_half(q.float()) * sin).type_as(v)
            k = (k.float() * cos + rotate_half(k.float()) * sin).type_as(v)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias
        probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, self.hidden_size)
        return self.o_proj(out)


class BaichuanMLP(nn.Module):
    def __init__(self, config: BaichuanConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class BaichuanLayer(nn.Module):
    def __init__(self, config: BaichuanConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = BaichuanAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = BaichuanMLP(config)

    def forward(self, hidden_states, rotary, bias, cache):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), rotary, bias, cache)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class NormHead(nn.Module):
    """Baichuan2's output head: ``linear(x, normalize(weight))``, rows of unit L2 norm; the stored weight is
    never modified."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, hidden_states):
        return F.linear(hidden_states, F.normalize(self.weight, dim=-1))


class BaichuanPreTrainedModel(PreTrainedModel):
    config_class = BaichuanConfig
    config: BaichuanConfig
    base_model_prefix = "model"
    _no_split_modules = ["BaichuanLayer"]
    _supports_sdpa = False
    _supports_flash_attn = False

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, NormHead)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class BaichuanModel(BaichuanPreTrainedModel):
    def __init__(self, config: BaichuanConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([BaichuanLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def _rotary(self, positions):
        dim = self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
        freqs = positions.float()[..., None] * inv_freq  # [b, s, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [b, 1, s, dim]
        return emb.cos(), emb.sin()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, past_key_values=None, **kwargs):
        inputs_embeds, cache, past, position_ids, mask = decoder_inputs(
            self, self.embed_tokens, input_ids, inputs_embeds, attention_mask, position_ids,
            cache if cache is not None else past_key_values, use_cache)
        s = inputs_embeds.shape[1]
        rotary, bias = None, mask
        if self.config.uses_alibi:
            slopes = torch.tensor(
                alibi_slopes(self.config.num_attention_heads), dtype=torch.float32, device=mask.device
            )
            keys = torch.arange(past + s, device=mask.device, dtype=torch.float32)
            bias = mask + (slopes[:, None, None] * keys).to(mask.dtype)  # slope * key position, per head
        else:
            rotary = self._rotary(position_ids)
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states, rotary, bias, cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), cache=cache)


class BaichuanForCausalLM(BaichuanPreTrainedModel, GenerationMixin):
    def __init__(self, config: BaichuanConfig):
        super().__init__(config)
        self.model = BaichuanModel(config)
        if config.norm_head:
            self.lm_head = NormHead(config.hidden_size, config.vocab_size)
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, past_key_values=None, logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache)
        return causal_lm_output(self, out.last_hidden_state, self.lm_head, out.cache, labels, logits_to_keep, **kwargs)
