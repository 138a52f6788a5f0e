"""The expert-parallel check of the conformance suite, for families whose models have routed experts: a
checkpoint converted with ``convert --ep 2`` and loaded by the 2 gloo ranks of the worker group (each holding half
the experts, megatron-core's alltoall dispatcher moving the tokens) gives the one-process logits."""
from __future__ import annotations

from pathlib import Path

from .checks import PARALLEL_ATOL, Case, _fail
from .expert_worker import expert_logits
from .workers import WorkerError, shared_workers


def expert_parallel_logits(checkpoint, ids_file, ep: int = 2, swap: bool = False, save=None, workers=None):
    """Rank 0's logits of the token ids in ``ids_file`` from ``checkpoint`` loaded by the ``ep`` ranks of
    ``workers`` (default the session's :func:`~pai_zoo_conformance.workers.shared_workers`;
    :func:`pai_zoo_conformance.expert_worker.expert_logits`: ``swap``, the last rank's first two experts swapped;
    ``save``, the folder the EP run saves its model into). A failed run is a ``ConformanceFailure`` with the
    rank's traceback."""
    import torch

    workers = workers or shared_workers()
    if workers.nproc != ep:
        _fail("expert parallel", f"ep={ep} needs {ep} ranks; the worker group has {workers.nproc}")
    try:
        return workers.run(expert_logits, str(checkpoint), torch.load(ids_file), ep, swap,
                           str(save) if save else None)[0]
    except WorkerError as exc:
        _fail("expert parallel", f"ep={ep}: {exc}")


def check_expert_parallel_equivalence(case: Case, folder: Path, ep: int = 2, atol: float = PARALLEL_ATOL) -> float:
    """``convert --to mcore --ep ep`` of the case's model, loaded with expert parallelism ``ep``: its logits equal
    the one-process load's within ``atol``. Returns the max |delta|."""
    import torch

    from pai_zoo.conversion.entry import convert
    from pai_zoo.models.handle import load

    folder = Path(folder)
    experts = int(case.mcore_config.get("num_moe_experts") or 0)
    if experts % ep:
        _fail("expert parallel", f"{case.preset}: {experts} experts do not split over ep={ep} ranks")
    case.hf_model.save_pretrained(folder / "hf")
    convert(folder / "hf", folder / "mcore", "mcore", ep=ep)
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(98))
    torch.save(ids, folder / "ids.pt")
    reference = load(folder / "mcore", backend="mcore").logits(ids)
    got = expert_parallel_logits(folder / "mcore", folder / "ids.pt", ep)[..., :vocab]
    if got.shape != reference.shape:
        _fail("expert parallel", f"ep={ep}: logits shape {tuple(got.shape)} != {tuple(reference.shape)}")
    delta = (got - reference).abs().max().item()
    if not delta <= atol:
        _fail("expert parallel", f"ep={ep}: max |logits delta| vs one process = {delta:.3g} > {atol:g}")
    return delta
