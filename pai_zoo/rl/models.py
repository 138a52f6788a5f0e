"""The models of an RL run: loading them as megatron-core ``GPTModel``s, checking that they fit
together, running them on padded batches, and their optimizers."""
from __future__ import annotations

from typing import Sequence

import torch

from ..errors import PaiZooError
from .heads import attach_score_head, has_score_head


def load_model(spec, tensor_parallel_size: int = 1, seed: int = 0, **overrides):
    """A :class:`~pai_zoo.handle.ModelHandle` (megatron-core backend) for a preset, HF folder or
    Megatron-Core checkpoint; an existing handle is returned as is."""
    import pai_zoo

    if hasattr(spec, "model") and hasattr(spec, "mcore_config"):
        return spec
    return pai_zoo.load(str(spec), backend="mcore", seed=seed, tensor_parallel_size=tensor_parallel_size, **overrides)


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
            raise PaiZooError(f"the {a_role} ({describe(a)}) and the {b_role} ({describe(b)}) have different tokenizers: "
                              f"{', '.join(differ)} differ; they must share a tokenizer")


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
    from ..mcore.pipeline import forward_logits

    return forward_logits(model, input_ids, attention_mask)


def make_optimizer(model, lr: float, weight_decay: float = 0.0):
    """The optimizer of a trained model: AdamW over its parameters."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay,
                             betas=(0.9, 0.95))


def grad_norm(model) -> torch.Tensor:
    """The global L2 norm of the gradients: tensor-parallel shards summed over the TP group,
    replicated parameters (norms, the score head) counted once."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

    total = torch.zeros((), dtype=torch.float32)
    for p in model.parameters():
        if p.grad is not None and param_is_not_tensor_parallel_duplicate(p):
            total = total + p.grad.detach().float().pow(2).sum().cpu()
    if ps.model_parallel_is_initialized() and ps.get_tensor_model_parallel_world_size() > 1:
        total = total.to(next(model.parameters()).device)
        torch.distributed.all_reduce(total, group=ps.get_tensor_model_parallel_group())
    return total.sqrt()


def clip_and_step(model, optimizer, max_grad_norm: float) -> float:
    """Clip the global gradient norm to ``max_grad_norm`` (0: no clipping), step, zero the
    gradients; returns the norm before clipping."""
    norm = grad_norm(model)
    if max_grad_norm > 0 and float(norm) > max_grad_norm:
        scale = max_grad_norm / (float(norm) + 1e-6)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
