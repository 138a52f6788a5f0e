"""pai-zoo's inference path for megatron-core models: a KV cache with keys stored after RoPE,
attention by SDPA over grouped heads, and linear layers without autograd machinery.

megatron-core's static KV cache (``StaticInferenceContext`` with ``SelfAttention``) stores keys
before RoPE and rotates the whole cache again at every step, recomputes the rotary cosines in
every layer and copies the cache once per query head (``repeat_interleave``) before attending.
On a CPU these per-layer operations cost more than the attention itself. This module keeps the
same model and weights and changes only how a generation step runs:

* :class:`KVCache` -- the context :func:`pai_zoo.generation.mcore_generate` passes to
  ``GPTModel.forward``. It is a ``StaticInferenceContext`` (same offsets, same decode flag), plus a
  per-step store of the rotary cosines and of the attention mask in the form SDPA takes, computed
  once per forward and shared by all layers.
* :class:`CachedSelfAttention` -- megatron-core's ``SelfAttention``; given a :class:`KVCache` in
  evaluation mode it rotates only the new queries and keys, appends keys and values
  ``[batch, groups, positions, head_dim]`` to the cache and attends with
  ``torch.nn.functional.scaled_dot_product_attention`` (``enable_gqa``: no copies per head).
  Core attentions other than megatron's own ``DotProductAttention`` (ALiBi's and Falcon's
  subclasses) receive the cached keys in megatron's layout instead, so their biases apply as in
  training; an output gate (``attention_output_gate``) applies as megatron-core's. Anything else (training,
  megatron's own inference context, packed sequences, sliding windows, YaRN, attention sinks) runs megatron-core's
  ``forward`` unchanged.
* :class:`InferenceColumnParallelLinear` and :class:`InferenceRowParallelLinear` -- megatron-core's
  local tensor-parallel linear layers; under ``torch.inference_mode()`` they run the same
  operations (``matmul``, bias, the tensor-parallel gather or all-reduce) without megatron's
  autograd functions, which on a CPU cost as much as a small layer's matmul, and multiply a
  batch of rows by a wide weight in blocks (:func:`_matmul`). Outside inference mode (training,
  RL updates) they are megatron's layers.

:func:`pai_zoo.mcore.build.build_gpt_model` puts these into every family's layer spec
(:func:`with_inference_path`) wherever the spec uses megatron-core's ``SelfAttention``,
``ColumnParallelLinear`` and ``RowParallelLinear``, and into the model's output layer
(:func:`use_inference_output_layer`): no family code changes, and parameters and state dict are
megatron's.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from megatron.core.inference.contexts import StaticInferenceContext
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention

from .specs import layer_specs, submodules_of

__all__ = [
    "CachedSelfAttention",
    "InferenceColumnParallelLinear",
    "InferenceRowParallelLinear",
    "KVCache",
    "megatron_inference_mode",
    "use_inference_output_layer",
    "with_inference_path",
]


class KVCache(StaticInferenceContext):
    """A static KV cache of ``max_batch_size`` rows and ``max_sequence_length`` positions for
    :class:`CachedSelfAttention` layers (megatron's own layers use the inherited storage).

    Set ``sequence_len_offset`` (cache slots already filled) before each forward, as with
    megatron's context. Slots are positions for RoPE: left padding shifts a row's slots, which
    rotary attention does not see (it depends on distances only)."""

    def __init__(self, max_batch_size: int, max_sequence_length: int):
        super().__init__(max_batch_size, max_sequence_length)
        self._rotary = None  # (freqs, start, end, dtype, cos, sin) of the current step
        self._mask = None  # (mask given, mask for SDPA)
        #: the recurrent layers' state (Gated DeltaNet, Mamba-2: conv and SSM / delta-rule states), layer number ->
        #: whatever the layer keeps; filled by the prompt's forward, updated by every decode step
        self.recurrent: dict = {}

    def store(self, layer: int, key, value):
        """Append ``key``/``value`` ``[s, b, groups, head_dim]`` at the current offset; return the
        layer's keys and values so far, ``[b, groups, offset + s, head_dim]`` (views)."""
        start, rows = self.sequence_len_offset, self.batch_size_offset
        end, batch = start + key.shape[0], key.shape[1]
        if end > self.max_sequence_length:
            raise ValueError(f"KV cache of {self.max_sequence_length} positions is full (writing up to {end})")
        slot = ("pai_zoo", layer)
        if slot not in self.key_value_memory_dict:
            shape = (self.max_batch_size, key.shape[2], self.max_sequence_length, key.shape[3])
            self.key_value_memory_dict[slot] = (key.new_empty(shape), value.new_empty(shape))
        keys, values = self.key_value_memory_dict[slot]
        keys[rows:rows + batch, :, start:end] = key.permute(1, 2, 0, 3)
        values[rows:rows + batch, :, start:end] = value.permute(1, 2, 0, 3)
        return keys[rows:rows + batch, :, :end], values[rows:rows + batch, :, :end]

    def rotary(self, freqs, start: int, end: int, dtype):
        """``(cos, sin)`` of the rotary angles ``freqs[start:end]`` (``[s, 1, 1, rot_dim]``), as
        megatron-core computes them, cached for the other layers of the same step."""
        cached = self._rotary
        if cached is not None and cached[0] is freqs and cached[1:4] == (start, end, dtype):
            return cached[4:]
        angles = freqs[start:end]
        cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)  # megatron's, without YaRN's mscale
        self._rotary = (freqs, start, end, dtype, cos, sin)
        return cos, sin

    def sdpa_mask(self, mask, dtype):
        """An additive mask for SDPA from megatron's boolean one (True = hidden), once per
        forward. Rows with every key hidden (queries on left padding) see all keys instead, so
        their outputs stay finite; no real token attends to them."""
        if mask is None:
            return None
        cached = self._mask
        if cached is not None and cached[0] is mask and cached[1].dtype == dtype:
            return cached[1]
        hidden = mask & ~mask.all(dim=-1, keepdim=True)
        additive = torch.zeros(hidden.shape, dtype=dtype, device=mask.device).masked_fill_(hidden, float("-inf"))
        self._mask = (mask, additive)
        return additive


def _rotate_half(x, interleaved: bool):
    """megatron-core's ``_rotate_half``: the last dimension as ``[-odd, +even]``."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1)
    return rotated.view(*rotated.shape[:-2], -1)


def _apply_rotary(t, cos, sin, interleaved: bool):
    """RoPE on the first ``cos.shape[-1]`` channels of ``t`` (the rest pass), as megatron-core."""
    rot = cos.shape[-1]
    if rot == t.shape[-1]:
        return t * cos + _rotate_half(t, interleaved) * sin
    head, rest = t[..., :rot], t[..., rot:]
    return torch.cat((head * cos + _rotate_half(head, interleaved) * sin, rest), dim=-1)


class CachedSelfAttention(SelfAttention):
    """megatron-core's ``SelfAttention`` with pai-zoo's generation path (see the module
    docstring); identical to its parent otherwise, parameters and state dict included."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        core = self.core_attention
        window = getattr(getattr(core, "scale_mask_softmax", None), "window_size", None)
        self._cached = (
            isinstance(core, DotProductAttention)
            and window is None
            and not config.flash_decode
            and not getattr(config, "multi_latent_attention", False)
            and not hasattr(config, "yarn_rotary_scaling_factor")
            and getattr(core, "softmax_offset", None) is None  # attention sinks: megatron's softmax
        )
        # megatron's own DotProductAttention (and its scale) goes to SDPA; subclasses add biases
        self._sdpa = type(core) is DotProductAttention and not config.apply_query_key_layer_scaling
        self._scale = getattr(core, "softmax_scale", None)
        no_rope = getattr(config, "no_rope_freq", None)
        self._no_rope = bool(no_rope and no_rope[self.layer_number - 1])

    def _apply_output_gate(self, x, gate):
        """megatron-core's ``x * sigmoid(gate)`` (float32 gate), without its ``jit_fuser`` (``torch.compile``: seconds
        on a CPU's first call)."""
        return (x * torch.sigmoid(gate.contiguous().view(*x.shape).float())).to(x.dtype)

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        cache = kwargs.get("inference_context") or kwargs.get("inference_params")
        if (not isinstance(cache, KVCache) or not self._cached or self.training or args
                or kwargs.get("key_value_states") is not None or kwargs.get("packed_seq_params") is not None):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        return self._cached_forward(hidden_states, attention_mask, cache, kwargs.get("rotary_pos_emb"),
                                    kwargs.get("attention_bias"))

    def _cached_forward(self, hidden_states, attention_mask, cache: KVCache, rotary_pos_emb, attention_bias):
        length, start = hidden_states.shape[0], cache.sequence_len_offset
        if attention_mask is None and length > 1 and start > 0:
            raise ValueError(
                "CachedSelfAttention: several new tokens after a filled cache need an explicit attention mask"
            )
        gated = bool(getattr(self.config, "attention_output_gate", False))  # Qwen3-Next's sigmoid output gate
        if gated:
            query, key, value, gate = self.get_query_key_value_tensors(hidden_states, None, output_gate=True)
        else:
            query, key, value = self.get_query_key_value_tensors(hidden_states, None)  # [s, b, heads, head_dim]
        batch = query.shape[1]
        if rotary_pos_emb is not None and not self._no_rope:
            freqs = rotary_pos_emb[0] if isinstance(rotary_pos_emb, tuple) else rotary_pos_emb
            if getattr(self.config, "mrope_section", None) is not None:  # M-RoPE: angles of these tokens only
                cos, sin = cache.rotary(freqs, 0, length, query.dtype)  # [s, b, 1, dim], from their position ids
            else:
                cos, sin = cache.rotary(freqs, start, start + length, query.dtype)
            query = _apply_rotary(query, cos, sin, self.config.rotary_interleaved)
            key = _apply_rotary(key, cos, sin, self.config.rotary_interleaved)
        keys, values = cache.store(self.layer_number, key, value)  # [b, groups, positions, head_dim]
        if self._sdpa:  # no mask: the first forward is causal, a single new token sees every cached one
            out = F.scaled_dot_product_attention(
                query.permute(1, 2, 0, 3), keys, values, attn_mask=cache.sdpa_mask(attention_mask, query.dtype),
                is_causal=attention_mask is None and length > 1, scale=self._scale,
                enable_gqa=keys.shape[1] != query.shape[2])
            out = out.permute(2, 0, 1, 3).reshape(length, batch, -1)
        else:  # a core attention with its own bias (ALiBi): megatron's layout [positions, b, groups, head_dim]
            out = self.core_attention(
                query,
                keys.permute(2, 0, 1, 3).contiguous(),
                values.permute(2, 0, 1, 3).contiguous(),
                attention_mask,
                attn_mask_type=self.attn_mask_type,
                attention_bias=attention_bias,
                packed_seq_params=None,
            )
        if gated:
            out = self._apply_output_gate(out, gate)
        return self.linear_proj(out)


def _plain(layer) -> bool:
    """Whether a linear layer's forward is a matmul plus tensor-parallel collectives only."""
    config = layer.config
    return not (layer.sequence_parallel or layer.explicit_expert_comm or getattr(layer, "is_expert", False)
                or config._cpu_offloading_context is not None or config.defer_embedding_wgrad_compute)


#: Output features per matmul when several rows go through a linear layer (see :func:`_matmul`).
MATMUL_BLOCK = 2048


def _matmul(input_, weight):
    """``input_ @ weight.T`` as megatron-core computes it, with the output features in blocks of
    :data:`MATMUL_BLOCK` when more than one row is multiplied. CPU BLAS kernels multiply a few
    rows by a wide transposed weight slowly (8 rows by a 32000-entry vocabulary: 1.6x the time
    of the blocks); each output element is the same dot product (bit-identical on the machines
    measured). GPUs multiply in one call."""
    if input_.device.type != "cpu" or input_.numel() <= input_.shape[-1] or weight.shape[0] <= MATMUL_BLOCK:
        return torch.matmul(input_, weight.t())
    return torch.cat([torch.matmul(input_, block.t()) for block in weight.split(MATMUL_BLOCK)], dim=-1)


def _tp_size(layer) -> int:
    group = getattr(layer, "tp_group", None)
    return 1 if group is None else group.size()


class InferenceColumnParallelLinear(ColumnParallelLinear):
    """megatron-core's ``ColumnParallelLinear``; under ``torch.inference_mode()`` its forward
    without autograd functions (same operations: ``matmul``, ``+ bias``, gather)."""

    def forward(self, input_, weight=None, runtime_gather_output=None):
        if not torch.is_inference_mode_enabled() or not _plain(self) or (weight is None and self.weight is None):
            return super().forward(input_, weight, runtime_gather_output)
        output = _matmul(input_, self.weight if weight is None else weight)
        if self.bias is not None and not self.skip_bias_add:
            output = output + self.bias
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather and _tp_size(self) > 1:
            output = gather_from_tensor_model_parallel_region(output, group=self.tp_group)
        return output, (self.bias if self.skip_bias_add else None)


class InferenceRowParallelLinear(RowParallelLinear):
    """megatron-core's ``RowParallelLinear``; under ``torch.inference_mode()`` its forward
    without autograd functions (same operations: ``matmul``, all-reduce, ``+ bias``)."""

    def forward(self, input_):
        if not torch.is_inference_mode_enabled() or not _plain(self) or not self.input_is_parallel:
            return super().forward(input_)
        output = _matmul(input_, self.weight)
        if _tp_size(self) > 1:
            output = reduce_from_tensor_model_parallel_region(output, group=self.tp_group)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None


#: megatron-core classes in a layer spec and their replacements.
_REPLACEMENTS = {
    SelfAttention: CachedSelfAttention,
    ColumnParallelLinear: InferenceColumnParallelLinear,
    RowParallelLinear: InferenceRowParallelLinear,
}


def _replace(spec) -> None:
    """Swap the classes of ``_REPLACEMENTS`` in a ``ModuleSpec`` tree, in place."""
    if getattr(spec, "module", None) in _REPLACEMENTS:
        spec.module = _REPLACEMENTS[spec.module]
    submodules = submodules_of(spec)  # a ModuleSpec's, or a megatron-core 0.19 MLP builder's
    if submodules is None:
        return
    for name in getattr(submodules, "__dataclass_fields__", {}):
        child = getattr(submodules, name)
        if isinstance(child, type) and child in _REPLACEMENTS:
            setattr(submodules, name, _REPLACEMENTS[child])
        elif submodules_of(child) is not None or hasattr(child, "module"):
            _replace(child)


def with_inference_path(spec):
    """A copy of a layer ``ModuleSpec`` (or ``TransformerBlockSubmodules``) in which megatron-core's
    ``SelfAttention``, ``ColumnParallelLinear`` and ``RowParallelLinear`` are this module's
    subclasses; every other module stays as it is."""
    spec = copy.deepcopy(spec)
    for layer in layer_specs(spec):
        _replace(layer)
    return spec


def use_inference_output_layer(model) -> None:
    """Give a ``GPTModel``'s output layer (built by ``GPTModel`` itself, not by the layer spec)
    the inference forward of :class:`InferenceColumnParallelLinear`; parameters, hooks and state
    dict are untouched."""
    layer = getattr(model, "output_layer", None)
    if type(layer) is ColumnParallelLinear:
        layer.__class__ = InferenceColumnParallelLinear


def megatron_inference_mode():
    """A context in which megatron-core treats forwards as an inference engine's.

    megatron-core 0.16 takes that from the ``inference_context`` argument alone; from 0.19 on
    ``GPTModel`` reads the process-wide ``megatron.core.inference.utils.InferenceMode`` flag instead
    (which, among other things, cuts a prefill's logits to the last position). This sets that flag
    where it exists and does nothing before."""
    import contextlib

    try:
        from megatron.core.inference.utils import InferenceMode
    except ImportError:  # megatron-core < 0.19
        return contextlib.nullcontext()
    return InferenceMode.active() if hasattr(InferenceMode, "active") else contextlib.nullcontext()
