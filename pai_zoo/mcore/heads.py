"""The scalar (value / reward) head that replaces a ``GPTModel``'s LM head.

A reward model or critic is a megatron-core ``GPTModel`` whose ``output_layer`` is a
:class:`ScalarHead`: the model's forward returns ``[batch, seq, 1]`` scores instead of logits.
The head is replicated on every tensor-parallel rank and checkpointed as ``output_layer.weight``
``[1, hidden]``; the checkpoint's ``pai_zoo.json`` records ``"head": {"kind": "score", ...}`` so
that :func:`pai_zoo.load` rebuilds it and ``pai-zoo convert --to hf`` writes a Hugging Face
``*ForSequenceClassification`` model (``score.weight``) whose rewards are the same.
"""
from __future__ import annotations

import torch

from ..tables.mapping import Copy, Output, WeightMap

SCORE = "score"
HF_SCORE = "score.weight"


class ScalarHead(torch.nn.Module):
    """``hidden [s, b, h] -> scores [s, b, 1]``; called like megatron's output layer. Not a
    megatron module: megatron-core checkpoints its weight as a tensor replicated across ranks."""

    def __init__(self, hidden_size: int, dtype=torch.float32, init_std: float = 0.02, seed: int = 0):
        super().__init__()
        weight = torch.empty(1, hidden_size, dtype=torch.float32)
        weight.normal_(0.0, init_std, generator=torch.Generator().manual_seed(seed))  # same on every TP rank
        self.weight = torch.nn.Parameter(weight.to(dtype))
        self.sequence_parallel = False

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        return torch.matmul(hidden_states, self.weight.t()), None


def head_record(pad_token_id: int | None) -> dict:
    """What ``pai_zoo.json`` stores about a score head."""
    return {"kind": SCORE, "num_labels": 1, "pad_token_id": pad_token_id}


def attach_score_head(model, seed: int = 0, init_std: float = 0.02):
    """Replace ``model.output_layer`` by a fresh :class:`ScalarHead` (and untie it from the
    embedding); returns the model."""
    dtype = next(model.parameters()).dtype
    model.output_layer = ScalarHead(model.config.hidden_size, dtype, init_std, seed)
    model.share_embeddings_and_output_weights = False
    return model


def has_score_head(model) -> bool:
    return isinstance(getattr(model, "output_layer", None), ScalarHead)


def untied(config):
    """``config`` (an McoreConfig) with its own output weights: a score head is never tied."""
    import dataclasses

    return dataclasses.replace(config, arch=dict(config.arch, share_embeddings_and_output_weights=False))


def score_weight_map(table):
    """``table`` with its LM-head row (``Output``) replaced by ``score.weight <-> output_layer.weight``."""

    rows = [Copy(HF_SCORE, row.mcore[0]) if isinstance(row, Output) else row for row in table.rows]
    return WeightMap(*rows)


def sequence_classification_config(hf_config, head: dict):
    """Turn a causal-LM transformers config into its ``*ForSequenceClassification`` one."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    name = archs[0] if archs else type(hf_config).__name__.replace("Config", "ForCausalLM")
    hf_config.architectures = [name.replace("ForCausalLM", "ForSequenceClassification")]
    hf_config.num_labels = head.get("num_labels", 1)
    hf_config.pad_token_id = head.get("pad_token_id")
    hf_config.tie_word_embeddings = False
    return hf_config


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token (the rightmost 1 of ``attention_mask``), where the
    score of a sequence is read: the rightmost non-padding token, as transformers'
    ``*ForSequenceClassification`` reads it."""
    mask = attention_mask.long()
    positions = torch.arange(mask.shape[-1]).expand_as(mask)
    return (positions * mask).argmax(-1)


def sequence_scores(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``values [b, s(, 1)]`` read at each row's last real token -> ``[b]``."""
    if values.dim() == 3:
        values = values.squeeze(-1)
    return values[torch.arange(values.shape[0]), last_token_index(attention_mask)]
