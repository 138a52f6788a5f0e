"""The models of an RL run: loading them as megatron-core ``GPTModel``s, checking that they fit
together, running them on padded batches, and their optimizers."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..mcore.heads import attach_score_head, has_score_head
from ..mcore.pipeline import forward_logits
from ..models.handle import load
from ..plugin.errors import PaiZooError
from ..training.optim import megatron_optimizer


def load_model(spec, tensor_parallel_size: int = 1, seed: int = 0, pipeline_parallel_size: int = 1, **overrides):
    """A :class:`~pai_zoo.models.handle.ModelHandle` (megatron-core backend) for a preset, HF folder or
    Megatron-Core checkpoint, sharded ``tensor_parallel_size`` x ``pipeline_parallel_size`` ways (the other
    ranks of the world are data-parallel); an existing handle is returned as is."""
    if hasattr(spec, "model") and hasattr(spec, "mcore_config"):
        return spec
    return load(str(spec), backend="mcore", seed=seed, tensor_parallel_size=tensor_parallel_size,
                pipeline_parallel_size=pipeline_parallel_size, **overrides)


def value_model(spec, tensor_parallel_size: int = 1, seed: int = 0, init_std: float = 0.02):
    """A model with a score head: a reward model / critic checkpoint as saved, or a language model
    whose LM head is replaced by a new score head (``init_std`` 0: zeros)."""
    handle = load_model(spec, tensor_parallel_size, seed)
    if not has_score_head(handle.model):
        attach_score_head(handle.model, seed=seed, init_std=init_std)
    return handle


def describe(handle) -> str:
    return str(handle.checkpoint) if handle.checkpoint is not None else f"{handle.family.name} preset"


def check_same_tokenizer(a, b, a_role: str, b_role: str) -> None:
    """Raise unless two models share a vocabulary (size and, where both carry them, tokenizer files)."""
    from .checkpoint import checkpoint_tokenizer_files

    if a.vocab_size != b.vocab_size:
        raise PaiZooError(f"the {a_role} ({describe(a)}) and the {b_role} ({describe(b)}) have different vocabularies: "
                          f"{a.vocab_size} vs {b.vocab_size} tokens; they must share a tokenizer")
    files_a, files_b = checkpoint_tokenizer_files(a.checkpoint), checkpoint_tokenizer_files(b.checkpoint)
    if files_a and files_b:
        differ = sorted(n for n in files_a.keys() | files_b.keys() if files_a.get(n) != files_b.get(n))
        if differ:
            raise PaiZooError(
                f"the {a_role} ({describe(a)}) and the {b_role} ({describe(b)}) have different tokenizers: "
                f"{', '.join(differ)} differ; they must share a tokenizer"
            )


def pad_id_of(handle) -> int:
    """The padding id of a model's batches, recorded with a reward model (transformers reads the
    score at the rightmost token that is not it): the tokenizer's pad id, else the config's, else 0."""
    tokenizer = handle.tokenizer
    if tokenizer is not None and tokenizer.pad_id is not None:
        return int(tokenizer.pad_id)
    configured = getattr(handle.hf_config, "pad_token_id", None)
    return int(configured) if configured is not None else 0


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int = 0):
    """``(ids [b, L], mask [b, L])`` with each sequence left-aligned."""
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def forward(model, input_ids, attention_mask):
    """The model's output ``[b, s, padded vocab | 1]`` on a padded batch (left or right padding),
    with gradients when the caller wants them."""

    return forward_logits(model, input_ids, attention_mask)


class Optimizer:
    """How a model of an RL run is trained, with the pieces ``pai-zoo train`` uses: megatron-core's
    ``DistributedDataParallel`` (gradient buffers, data-parallel reduction), its Adam optimizer
    (tensor-parallel-aware gradient-norm clipping) and an ``OptimizerParamScheduler`` at a constant
    learning rate; checkpointed with :mod:`pai_zoo.training.run_checkpoint`."""

    def __init__(self, model, lr: float, weight_decay: float = 0.0, max_grad_norm: float = 1.0):
        self.model = model
        self.ddp, self.optimizer, self.scheduler = megatron_optimizer(
            model, lr=lr, weight_decay=weight_decay, clip_grad=max_grad_norm)
        self.zero_grad()

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def step(self, reduce: bool = True) -> float:
        """Reduce the gradients of the losses backpropagated since :meth:`zero_grad` (``reduce=False``: megatron's
        schedule has reduced them already), clip them, update the weights, zero the gradients; returns the gradient
        norm before clipping."""
        from megatron.core.distributed import finalize_model_grads

        if reduce:
            finalize_model_grads([self.ddp])
        ok, norm, _ = self.optimizer.step()
        if not ok:
            raise PaiZooError("the optimizer step failed (non-finite gradients)")
        self.scheduler.step(increment=1)
        self.zero_grad()
        return float(norm or 0.0)
