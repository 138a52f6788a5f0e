"""Packed records stay apart: a training batch whose row packs several records (block-diagonal mask, positions
restarting at each record, padding after them, as :func:`pai_zoo.training.data.collate` builds it) gives every
record the loss it has alone. Attention keeps records apart through the mask; recurrent layers (Gated DeltaNet,
Mamba-2) must restart their state at each record start (:mod:`pai_zoo.mcore.segments`)."""
from __future__ import annotations

from .cases import Case, _fail

#: The records of the check: lengths (tokens, the last one's label dropped); rows of the packed batch.
RECORDS = ((6, 9, 5), (11,))
#: The packed rows' length (padding after the records).
PACKED_LENGTH = 24
#: The bound on every token's loss and on the sum of the losses (float32).
LOSS_ATOL = 1e-5


def _sample(tokens_list):
    """One collate sample (tokens, labels, loss mask, positions, segment ids) packing ``tokens_list``."""
    import torch

    parts = [(t[:-1], t[1:], torch.ones(len(t) - 1), torch.arange(len(t) - 1), torch.full((len(t) - 1,), k))
             for k, t in enumerate(tokens_list)]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(5))


def _losses(model, batch):
    import torch

    with torch.no_grad():
        loss = model(batch.tokens, batch.position_ids, batch.attention_mask, labels=batch.labels)
    return loss.float() * batch.loss_mask


def check_packed_records(case: Case) -> float:
    """Every record's per-token losses in the packed batch equal its losses alone within :data:`LOSS_ATOL`, and so
    does the batch's summed loss against the records' summed losses. Returns the max |delta|."""
    import torch

    from pai_zoo.training.data import collate

    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(11)
    rows = [[torch.randint(0, vocab, (n + 1,), generator=gen) for n in row] for row in RECORDS]
    model = case.mcore_model
    was_training = model.training
    model.eval()
    try:
        packed = _losses(model, collate([_sample(row) for row in rows], PACKED_LENGTH))
        worst, alone_total = 0.0, 0.0
        for b, row in enumerate(rows):
            start = 0
            for tokens in row:
                n = len(tokens) - 1
                alone = _losses(model, collate([_sample([tokens])], n))[0]
                delta = (packed[b, start:start + n] - alone).abs().max().item()
                if not delta <= LOSS_ATOL:
                    _fail("packing", f"row {b}, record at tokens {start}..{start + n - 1}: per-token loss differs "
                                     f"from the record's alone by {delta:.3g} > {LOSS_ATOL:g} (a record sees another's "
                                     "tokens or state)")
                worst, alone_total, start = max(worst, delta), alone_total + alone.double().sum().item(), start + n
    finally:
        model.train(was_training)
    total = abs(packed.double().sum().item() - alone_total)
    if not total <= LOSS_ATOL:
        _fail("packing", f"summed loss of the packed batch differs from the records' summed losses by {total:.3g}")
    return max(worst, total)
