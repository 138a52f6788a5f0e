"""M-RoPE on interleaved channel pairs (GLM-4.1V's language model): a declared option of the core.

megatron-core's ``MultimodalRotaryEmbedding`` (``position_embedding_type="mrope"``) lays its angles out as two
halves (``rotate_half``); with ``rotary_interleaved=True`` its forward reshapes with the wrong size (0.16.1 and
0.19.2: ``view(3, bs, freqs.shape[0], -1)``) and then cuts the sections as if the angles were halves. transformers'
GLM-4.1V rotates pairs ``(x0, x1), (x2, x3) ...`` of the rotary part of each head (``rotate_half_llm``), and gives
pair ``i`` the angle of frequency ``i`` on the axis (temporal, height, width) whose ``mrope_section`` holds ``i``.

:func:`paired_mrope_class` gives a ``GPTModel`` subclass whose rotary embedding makes those angles:
``[seq, batch, 1, rotary_dim]``, each pair's angle twice in a row, which megatron-core's attention applies with
``rotary_interleaved=True`` (its ``_rotate_half`` pairs channels the same way), as pai-zoo's KV-cache path does.
Partial rotary (``rotary_percent``) is megatron-core's: the angles cover the first ``rotary_dim`` channels.
Parameters and state dict are unchanged.
"""
from __future__ import annotations

import functools

__all__ = ["paired_mrope_angles", "paired_mrope_class"]


def paired_mrope_angles(inv_freq, position_ids, mrope_section):
    """``[seq, batch, 1, 2 * len(inv_freq)]`` angles for ``position_ids`` ``[3, batch, seq]``: frequency ``i``
    on the axis whose section holds ``i`` (sections in order temporal, height, width), each repeated twice."""
    import torch

    if sum(mrope_section) != inv_freq.numel():
        raise ValueError(f"mrope_section {list(mrope_section)} covers {sum(mrope_section)} frequencies, not the "
                         f"rotary embedding's {inv_freq.numel()}")
    freqs = position_ids.to(inv_freq.device).float()[..., None] * inv_freq.float()  # [3, b, s, dim/2]
    chosen = torch.cat([part[i % 3] for i, part in enumerate(freqs.split(list(mrope_section), dim=-1))], dim=-1)
    return chosen.repeat_interleave(2, dim=-1).transpose(0, 1)[:, :, None, :].contiguous()


def _rotary_forward(self, position_ids, mrope_section, cp_group=None, **_):
    from megatron.core.models.common.embeddings.rope_utils import get_pos_emb_on_this_cp_rank

    emb = paired_mrope_angles(self.inv_freq, position_ids, mrope_section)
    if getattr(self, "seq_len_interpolation_factor", None) is not None:
        emb = emb / self.seq_len_interpolation_factor
    group = cp_group if cp_group is not None else getattr(self, "cp_group", None)
    if group is not None and group.size() > 1:
        emb = get_pos_emb_on_this_cp_rank(emb, 0, group)
    return emb


@functools.cache
def _paired_rotary_class(base: type) -> type:
    return type(f"Paired{base.__name__}", (base,), {"forward": _rotary_forward, "__doc__": __doc__})


@functools.cache
def paired_mrope_class(base: type) -> type:
    """``base`` (``GPTModel``) whose M-RoPE angles rotate interleaved pairs (see the module docstring). The model
    must be built with ``position_embedding_type="mrope"`` and ``rotary_interleaved=True``."""

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        rotary = getattr(self, "rotary_pos_emb", None)
        if rotary is None or self.position_embedding_type != "mrope" or not self.config.rotary_interleaved:
            raise ValueError("paired M-RoPE needs position_embedding_type='mrope' and rotary_interleaved=True")
        rotary.__class__ = _paired_rotary_class(type(rotary))

    return type(f"PairedMRope{base.__name__}", (base,), {"__init__": __init__, "__doc__": paired_mrope_class.__doc__})
