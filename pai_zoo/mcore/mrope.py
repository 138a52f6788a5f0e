"""Interleaved M-RoPE (Qwen3-VL) on megatron-core's ``GPTModel``.

megatron-core's ``MultimodalRotaryEmbedding`` (0.16 and 0.19 alike) gives M-RoPE's three position axes
(temporal, height, width) contiguous blocks of frequencies: ``mrope_section = [t, h, w]`` frequencies, in that
order (Qwen2-VL / Qwen2.5-VL). Qwen3-VL interleaves them (transformers' ``Qwen3VLTextRotaryEmbedding``,
``rope_parameters.mrope_interleaved``): frequency ``i`` (of ``head_dim / 2``) takes the height position when
``i % 3 == 1`` and ``i < 3 * h``, the width position when ``i % 3 == 2`` and ``i < 3 * w``, the temporal one
otherwise (``[THWTHW...TT]``); the angles are then repeated for the two halves (``rotate_half``), as megatron-core's
non-interleaved rotary applies them.

The core option is the arch key :data:`MROPE_INTERLEAVED` (``True``), set by a family's config translation;
:func:`apply` (called by :func:`pai_zoo.mcore.build.build_gpt_model`) swaps the built model's rotary embedding
for :class:`InterleavedMultimodalRotaryEmbedding`, a subclass with the same inverse frequencies, arguments and
context-parallel slicing. Plain ``mrope`` is untouched.
"""
from __future__ import annotations

import functools

from ..plugin.config_map import CORE_KEY_PREFIX, McoreConfig

__all__ = ["MROPE_INTERLEAVED", "apply", "interleaved_axes"]

#: Arch key: M-RoPE's frequencies interleaved over the three axes (Qwen3-VL) instead of in contiguous sections.
MROPE_INTERLEAVED = CORE_KEY_PREFIX + "mrope_interleaved"


def interleaved_axes(section, frequencies: int):
    """The position axis (0 temporal, 1 height, 2 width) of each of ``frequencies`` frequencies."""
    import torch

    axes = torch.zeros(frequencies, dtype=torch.long)
    for axis in (1, 2):
        idx = torch.arange(axis, min(3 * int(section[axis]), frequencies), 3)
        axes[idx] = axis
    return axes


@functools.cache
def _interleaved_class(base: type) -> type:
    def forward(self, position_ids, mrope_section, cp_group=None):
        import torch
        from megatron.core.models.common.embeddings.rotary_pos_embedding import get_pos_emb_on_this_cp_rank

        seq = position_ids.to(device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        if self.seq_len_interpolation_factor is not None:
            seq = seq * (1 / self.seq_len_interpolation_factor)
        freqs = seq[..., None].float() * self.inv_freq.float()  # [3, b, s, dim/2]
        axes = interleaved_axes(mrope_section, freqs.shape[-1]).to(freqs.device)
        freqs = torch.gather(freqs, 0, axes.view(1, 1, 1, -1).expand(1, *freqs.shape[1:]))[0]  # [b, s, dim/2]
        if not self.rotary_interleaved:
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
        emb = emb[..., None, :].transpose(0, 1).contiguous()  # [s, b, 1, dim]
        cp_group = cp_group if cp_group is not None else self.cp_group
        if cp_group is not None and cp_group.size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb

    doc = f"megatron-core's ``{base.__name__}`` with the three axes' frequencies interleaved (Qwen3-VL)."
    return type(f"Interleaved{base.__name__}", (base,), {"forward": forward, "__doc__": doc})


def InterleavedMultimodalRotaryEmbedding():  # noqa: N802 - the class, built lazily (megatron-core import)
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding

    return _interleaved_class(MultimodalRotaryEmbedding)


def apply(model, config: McoreConfig) -> None:
    """Interleave ``model``'s M-RoPE frequencies when the arch says :data:`MROPE_INTERLEAVED`; else nothing."""
    if not config.get(MROPE_INTERLEAVED):
        return
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding

    rotary = getattr(model, "rotary_pos_emb", None)
    if not isinstance(rotary, MultimodalRotaryEmbedding):
        raise ValueError(f"{MROPE_INTERLEAVED} needs position_embedding_type='mrope' (the model's rotary embedding "
                         f"is {type(rotary).__name__})")
    rotary.__class__ = _interleaved_class(type(rotary))
