"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5) on megatron-core's local spec, as transformers computes it.

A lightning indexer scores every visible key for each query and the attention sees only the ``index_topk``
best (transformers' ``DeepseekV32Indexer``)::

    q = RoPE(wq_b(qr))  [heads H, dim D]     k = RoPE(LayerNorm(wk(x)))  [dim D]   (RoPE on the first R channels)
    score[s, t] = sum_h  weights_proj(x)[s, h] * H**-0.5 * relu(q[s, h] . k[t] * D**-0.5)
    attention of query s: the causal mask AND the top-k keys of score[s] (masked keys scored -inf)

``qr`` is the normalised low-rank query (MLA's ``q_layernorm(linear_q_down_proj(x))``), ``x`` the layer's
normalised input. megatron-core has the parts (``DSAIndexer``, ``DSAttention``) but not in this form on a CPU:
its indexer applies a Hadamard rotation that needs ``fast_hadamard_transform`` and bf16 (an orthogonal map: q . k
is unchanged, transformers leaves it out), 0.16 puts the rotated channels last and rotates them MLA-interleaved
while transformers' DeepSeek-V3.2 rotates the first R channels half-split (GLM-5: interleaved), its sparse
attention ignores a padding mask (0.16), and 0.19 runs DSA only through its absorbed MLA. This module keeps
megatron-core's parameter names and module tree (``self_attention.core_attention.indexer.{linear_wq_b, linear_wk,
k_norm, linear_weights_proj}``) and computes transformers' way:

* :class:`SparseIndexer` -- megatron-core's ``DSAIndexer`` (its parameters) with transformers' scoring; the RoPE
  is the MLA's own (transformers' inverse frequencies and YaRN factor, given by :meth:`SparseCoreAttention.use_rotary`),
  half-split or interleaved (``interleaved``). Under tensor parallelism its weights are whole on every rank
  (megatron-core's ``parallel_mode="duplicated"``): every rank scores all keys, the attention heads split as MLA's.
  With pai-zoo's KV cache (:class:`pai_zoo.mcore.inference.KVCache`, or megatron's static context) the indexer's
  keys are cached per layer beside MLA's keys and values, so a decode step scores every earlier key.
* :class:`SparseCoreAttention` -- the MLA core attention (``DotProductAttention``, values ``v_channels`` wide)
  whose mask also hides the keys outside each query's top-k. A layer without an indexer (GLM-5's ``shared``
  layers) reuses the top-k of layer ``source`` from the same forward.
* :class:`IndexerInputs` -- a mixin for an ``MLASelfAttention`` subclass that hands its core attention the
  indexer's inputs (``x``, ``qr``) and the inference context.

Like transformers' (``@torch.no_grad``), the indexer takes no gradient from the language-model loss: the top-k
indices are integers. Its parameters are frozen (``requires_grad`` False: an optimizer's weight decay would
otherwise shrink them in training); megatron-core's KL loss that trains the indexer (``dsa_indexer_loss_coeff``)
is not computed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexer, DSAIndexerSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.utils import sharded_state_dict_default

__all__ = ["DuplicatedLinear", "IndexerInputs", "KeyLayerNorm", "SparseCoreAttention", "SparseIndexer",
           "index_mask"]

#: The key of the indexer's keys in an inference context's ``key_value_memory_dict`` (with the layer number).
CACHE_SLOT = "pai_zoo.dsa_indexer"


class DuplicatedLinear(MegatronModule):
    """A bias-free linear layer whole on every tensor-parallel rank, built with the arguments megatron-core's
    ``DSAIndexer`` gives its ``linear_*`` (``parallel_mode="duplicated"``, Transformer Engine's ``TELinear`` in
    its own spec); returns ``(output, None)`` as megatron's linears do."""

    def __init__(self, input_size, output_size, *, config, init_method=None, bias=False, **kwargs):
        super().__init__(config=config)
        if bias:
            raise ValueError("DuplicatedLinear has no bias (the indexer's projections have none)")
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
        if init_method is not None and config.perform_initialization:
            with torch.no_grad():
                init_method(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight), None


class KeyLayerNorm(torch.nn.LayerNorm):
    """The indexer's key norm: ``torch.nn.LayerNorm`` with weight and bias, built as megatron-core's norms are."""

    def __init__(self, config, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)


def _rotate(x, cos, sin, interleaved: bool):
    """transformers' RoPE on ``x`` (``cos``/``sin``: ``cat(freqs, freqs)``): half-split (``rotate_half``) or
    DeepSeek's interleaved pairs (``apply_rotary_pos_emb_interleave``, output de-interleaved)."""
    if not interleaved:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SparseIndexer(DSAIndexer):
    """megatron-core's ``DSAIndexer`` (same submodules and parameters) scoring as transformers does; see the module
    docstring. ``interleaved``: GLM-5's interleaved RoPE; ``relu``: the ReLU on each head's score."""

    def __init__(self, config, submodules=None, pg_collection=None, interleaved=False, relu=True, layer_number=1):
        submodules = submodules or DSAIndexerSubmodules(
            linear_wq_b=DuplicatedLinear, linear_wk=DuplicatedLinear, k_norm=KeyLayerNorm,
            linear_weights_proj=DuplicatedLinear)
        super().__init__(config, submodules, pg_collection=pg_collection)
        del self.rotary_pos_emb  # megatron-core's own; the MLA's (transformers' frequencies) is used instead
        self.interleaved, self.relu, self.layer_number = interleaved, relu, layer_number
        self.__dict__["_rotary"] = None
        for param in self.parameters():  # no gradient reaches them: frozen, so no optimizer decays them either
            param.requires_grad_(False)

    def _cos_sin(self, start: int, length: int, device):
        rotary = self.__dict__["_rotary"]
        positions = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=device, dtype=torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        factor = getattr(rotary, "attention_factor", 1.0)
        return emb.cos() * factor, emb.sin() * factor  # [s, R]

    def _cached_keys(self, k, context):
        """Append this step's keys ``[b, s, D]`` to the context's store; all keys so far ``[b, T, D]``."""
        start, rows = context.sequence_len_offset, context.batch_size_offset
        end, batch = start + k.shape[1], k.shape[0]
        slot = (CACHE_SLOT, self.layer_number)
        store = context.key_value_memory_dict.get(slot)
        if store is None:
            store = k.new_empty((context.max_batch_size, context.max_sequence_length, k.shape[-1]))
            context.key_value_memory_dict[slot] = store
        store[rows:rows + batch, start:end] = k
        return store[rows:rows + batch, :end]

    def topk_indices(self, x, qr, hidden, context=None):
        """The top-k key indices ``[b, s, k]`` of queries ``x`` ``[s, b, hidden]`` / ``qr`` ``[s, b, q_lora]``;
        ``hidden``: bool ``[b, s, T]``, True where a key is masked (or None: causal)."""
        if self.config.sequence_parallel and self.pg_collection.tp.size() > 1:
            x = gather_from_sequence_parallel_region(x, group=self.pg_collection.tp)
            qr = gather_from_sequence_parallel_region(qr, group=self.pg_collection.tp)
        length, batch = x.shape[:2]
        heads, dim, rot = self.index_n_heads, self.index_head_dim, self.qk_pos_emb_head_dim
        x, qr = x.transpose(0, 1), qr.transpose(0, 1)  # transformers' [b, s, ...]
        start = context.sequence_len_offset if context is not None else 0
        cos, sin = self._cos_sin(start, length, x.device)
        cos, sin = cos.to(x.dtype)[None, :, None], sin.to(x.dtype)[None, :, None]
        q = self.linear_wq_b(qr)[0].view(batch, length, heads, dim)
        q_rot, q_pass = torch.split(q, [rot, dim - rot], dim=-1)
        k = self.k_norm(self.linear_wk(x)[0]).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [rot, dim - rot], dim=-1)
        q = torch.cat([_rotate(q_rot, cos, sin, self.interleaved), q_pass], dim=-1)
        k = torch.cat([_rotate(k_rot, cos, sin, self.interleaved), k_pass], dim=-1).squeeze(2)
        if context is not None:
            k = self._cached_keys(k, context)
        scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale
        if self.relu:
            scores = F.relu(scores)
        # transformers keeps weights_proj in float32 (_keep_in_fp32_modules) and feeds it float32 inputs
        weights = F.linear(x.float(), self.linear_weights_proj.weight.float()) * (heads ** -0.5)
        index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [b, s, T]
        if hidden is None:
            hidden = causal_hidden(length, k.shape[1], x.device)[None]
        index = index.masked_fill(hidden, float("-inf"))
        return index.topk(min(self.index_topk, index.shape[-1]), dim=-1).indices


def causal_hidden(length: int, keys: int, device=None):
    """bool ``[s, T]``: True where key ``t`` is after query ``s`` (the queries are the last ``s`` of ``T``)."""
    return torch.ones(length, keys, dtype=torch.bool, device=device).triu(keys - length + 1)


def index_mask(topk, keys: int):
    """bool ``[b, 1, s, T]``: True at the keys outside each query's top-k."""
    b, s, _ = topk.shape
    return torch.ones(b, s, keys, dtype=torch.bool, device=topk.device).scatter(-1, topk.long(), False)[:, None]


class SparseCoreAttention(DotProductAttention):
    """MLA's core attention (values ``v_channels`` wide per head) restricted to each query's top-k keys: its own
    :class:`SparseIndexer`, or (``source``: a layer number) the top-k that layer chose in this forward."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, interleaved=False, relu=True, source=None,
                 **kwargs):
        if config.context_parallel_size > 1:
            raise NotImplementedError("DeepSeek sparse attention: context parallelism is not supported (the indexer "
                                      "scores every key of the sequence); use context_parallel_size 1")
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                         softmax_scale=softmax_scale, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_attention_head = v_channels
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition
        self.source = source
        self.indexer = None if source is not None else SparseIndexer(
            config, pg_collection=kwargs.get("pg_collection"), interleaved=interleaved, relu=relu,
            layer_number=layer_number)
        #: set per forward by :class:`IndexerInputs`: ``(x, qr)``, the inference context, the model's top-k store
        self.__dict__.update(inputs=None, context=None, shared_topk={})

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """megatron-core's (its learnable softmax offset, if any) plus the indexer's tensors, replicated over
        tensor-parallel ranks (``DotProductAttention``'s own leaves its children out)."""
        state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        if self.indexer is not None:
            state.update(sharded_state_dict_default(self.indexer, f"{prefix}indexer.", sharded_offsets, metadata,
                                                    tp_group=getattr(self, "tp_group", None)))
        return state

    def use_rotary(self, rotary) -> None:
        """The MLA's rotary embedding (``inv_freq``, ``attention_factor``), for the indexer's RoPE."""
        if self.indexer is not None:
            self.indexer.__dict__["_rotary"] = rotary

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if packed_seq_params is not None:
            raise NotImplementedError("DeepSeek sparse attention: packed sequences (thd) are not supported; "
                                      "pass the records as a block-diagonal attention mask")
        length, keys = query.shape[0], key.shape[0]
        hidden = None if attention_mask is None else attention_mask.expand(query.shape[1], 1, length, keys)
        if self.indexer is not None:
            x, qr = self.__dict__["inputs"]
            topk = self.indexer.topk_indices(x, qr, None if hidden is None else hidden[:, 0],
                                             self.__dict__["context"])
            self.__dict__["shared_topk"][self.layer_number] = topk
        else:
            topk = self.__dict__["shared_topk"].get(self.source)
            if topk is None:
                raise RuntimeError(f"DeepSeek sparse attention: layer {self.layer_number} reuses the top-k of layer "
                                   f"{self.source}, which did not run before it in this forward (another pipeline "
                                   "stage?)")
        if hidden is None:
            hidden = causal_hidden(length, keys, query.device)[None, None]
        mask = hidden | index_mask(topk, keys)
        return super().forward(query, key, value, mask, attn_mask_type=attn_mask_type,
                               attention_bias=attention_bias, packed_seq_params=None)


class IndexerInputs:
    """Mixin for an ``MLASelfAttention`` subclass whose core attention is a :class:`SparseCoreAttention`: hands
    it the indexer's inputs (the layer's normalised input and normalised low-rank query), the inference context
    and the model's store of top-k indices (shared by the layers built from one model config)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        core = self.core_attention
        core.__dict__["shared_topk"] = config.__dict__.setdefault("_pai_zoo_dsa_topk", {})
        core.use_rotary(self.rotary_pos_emb)

    def forward(self, hidden_states, attention_mask, *args, **kwargs):
        context = kwargs.get("inference_context") or kwargs.get("inference_params")
        if context is not None and not context.is_static_batching():
            raise NotImplementedError("DeepSeek sparse attention: only a static inference context is supported")
        self.core_attention.__dict__["context"] = context
        try:
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        finally:
            self.core_attention.__dict__.update(inputs=None, context=None)

    def get_query_key_value_tensors(self, hidden_states, *args, **kwargs):
        out = super().get_query_key_value_tensors(hidden_states, *args, **kwargs)
        self.core_attention.__dict__["inputs"] = (hidden_states.detach(), out[3].detach())
        return out
