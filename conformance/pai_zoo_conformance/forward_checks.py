"""The logits checks: transformers' and megatron-core's logits agree (text, and vision inputs where the family has a
tower), and a model loaded with tensor/pipeline parallelism gives the one-process logits."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .cases import Case, _fail
from .parallel_worker import layout_logits
from .workers import WorkerError, shared_workers

#: The fixed forward-equivalence bound used before (float32, CPU). The forward check now uses the rule of
#: ``convert --verify`` (:func:`pai_zoo.models.verification.compare_logits`: max |delta| <= atol + rtol x max |logits|,
#: float32's defaults), whose bound on every tiny preset is below this (tests/test_verify.py asserts it); plugin
#: tests still compare with it.
LOGITS_ATOL = 1e-4


def check_forward_equivalence(case: Case, batch: int = 2, seq_len: int | None = None, atol: float | None = None,
                              reach: bool | None = None) -> float:
    """Logits of the transformers and megatron-core models agree by :func:`pai_zoo.models.verification.compare_logits`
    (float32: max |delta| <= atol + rtol x max |logits|; a given ``atol``: that absolute bound) with the same
    argmax everywhere, at positions from 0 and at far positions (where RoPE scaling and
    long-range position handling show), and past every threshold of the config (:mod:`.thresholds`: the sequences
    are longer than each sliding window and attention chunk, and straddle each position where a scaling rule
    changes). ``seq_len`` fixes the length instead. With ``reach`` (default: on the family's odd preset) a threshold
    the check cannot reach fails it, naming the config key to set small. Returns max |delta|."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.models.verification import compare_logits

    from .thresholds import case_plan

    vocab = case.mcore_config["vocab_size"]
    plan = case_plan(case)
    if reach is None:
        reach = case.preset == case.family.odd
    if reach and plan.unreached:
        _fail("forward", f"{case.preset}: the check cannot reach " + "; ".join(
            f"{label} ({why})" for label, why in plan.unreached.items()) + ": set it small in the preset")
    offsets = plan.offsets
    if seq_len is None:
        seq_len = plan.seq_len
    else:  # a length of the caller's: the standard offsets
        max_positions = case.mcore_config.get("max_sequence_length") or seq_len
        offsets = sorted({0, max(0, min(max_positions - seq_len, 256))})
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    worst = 0.0
    for offset in offsets:
        positions = torch.arange(offset, offset + seq_len).expand(batch, seq_len)
        with torch.no_grad():
            expected = case.hf_model(input_ids=ids, position_ids=positions).logits.float()
            got = mcore_forward(case.mcore_model, ids, position_ids=positions)[..., :vocab].float()
        if got.shape != expected.shape:
            _fail("forward", f"logits shape {tuple(got.shape)} != transformers' {tuple(expected.shape)}")
        result = compare_logits(expected, got, "fp32", None if atol is None else (atol, 0.0))
        delta = result["max_abs_delta"]
        if not result["ok"]:
            _fail("forward", f"positions {offset}..{offset + seq_len - 1}: max |logits delta| = {delta:.3g} > "
                             f"{result['tolerance']:.3g} ({result['atol']:g} + {result['rtol']:g} x max |logits| "
                             f"{result['max_abs_logit']:.3g})")
        mismatched = (got.argmax(-1) != expected.argmax(-1)).nonzero().tolist()
        if mismatched:
            _fail("forward", f"positions from {offset}: argmax differs at (batch, position) {mismatched[:10]}")
        worst = max(worst, delta)
    if case.family.vision is not None:
        worst = max(worst, _check_vision_forward(case, atol))
    return worst


def logits_delta(case: Case, length: int, pad: int = 0, offset: int = 0, seed: int = 0) -> float:
    """Max |delta| between transformers' and megatron-core's float32 logits on 2 random sequences of ``length``
    tokens, on their real tokens: the second row left-padded by ``pad`` (positions counting from its first real
    token, as generation gives them), or, without padding, positions from ``offset``. For the plugin tests that
    reach past a family's chunk size or top-k with a length of their own."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward, positions_of

    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(seed))
    keep = torch.ones(2, length, dtype=torch.bool)
    keep[1, :pad] = False
    positions = positions_of(keep) + offset
    with torch.no_grad():
        want = case.hf_model(input_ids=ids, attention_mask=keep.long() if pad else None,
                             position_ids=positions).logits.float()
        got = mcore_forward(case.mcore_model, ids, attention_mask=keep.long() if pad else None,
                            position_ids=positions)[..., :vocab].float()
    return (got - want)[keep].abs().max().item()


def vision_example(case: Case, seed: int = 4321) -> tuple[Any, dict]:
    """A vision-language family's example batch (:attr:`pai_zoo.vision.VisionSpec.example`): ``(input_ids,
    vision inputs)``."""
    import torch

    spec = case.family.vision
    if spec.example is None:
        _fail("forward", f"family {case.family.name!r} declares a vision tower but no VisionSpec.example batch")
    inputs = dict(spec.example(case.mcore_config, torch.Generator().manual_seed(seed)))
    return inputs.pop("input_ids"), inputs


def _handles(case: Case):
    from pai_zoo.models.handle import ModelHandle

    return (ModelHandle(case.hf_model, case.family, "hf", case.hf_config, case.mcore_config),
            ModelHandle(case.mcore_model, case.family, "mcore", case.hf_config, case.mcore_config))


def _check_vision_forward(case: Case, atol: float | None) -> float:
    """The example batch with images (and videos): transformers' logits and megatron-core's agree as the text
    ones must."""
    from pai_zoo.models.verification import compare_logits

    ids, inputs = vision_example(case)
    hf, mcore = _handles(case)
    expected, got = hf.logits(ids, **inputs).float(), mcore.logits(ids, **inputs).float()
    result = compare_logits(expected, got, "fp32", None if atol is None else (atol, 0.0))
    if not result["ok"]:
        _fail("forward", f"with {', '.join(sorted(inputs))}: max |logits delta| = {result['max_abs_delta']:.3g} > "
                         f"{result['tolerance']:.3g}")
    mismatched = (got.argmax(-1) != expected.argmax(-1)).nonzero().tolist()
    if mismatched:
        _fail("forward", f"with {', '.join(sorted(inputs))}: argmax differs at (batch, position) {mismatched[:10]}")
    return result["max_abs_delta"]


#: Tolerance between a tensor/pipeline-parallel model's logits and the single-process ones.
PARALLEL_ATOL = 1e-5
#: The layouts the parallel check runs, each with 2 processes.
PARALLEL_LAYOUTS = ((2, 1), (1, 2))


def check_parallel_equivalence(case: Case, folder: Path, layouts=PARALLEL_LAYOUTS, atol: float = PARALLEL_ATOL,
                               workers=None) -> dict:
    """Logits of the model loaded with each ``(tp, pp)`` layout (by the 2 gloo ranks of ``workers``, default the
    session's :func:`~pai_zoo_conformance.workers.shared_workers`) equal the single-process logits within ``atol``.
    Returns max |delta| per layout."""
    import torch

    from pai_zoo.conversion.entry import convert
    from pai_zoo.models.handle import load

    workers = workers or shared_workers()
    folder = Path(folder)
    names = ", ".join(f"tp={tp} pp={pp}" for tp, pp in layouts)
    too_big = [f"tp={tp} pp={pp}" for tp, pp in layouts if workers.nproc % (tp * pp)]
    if too_big:
        _fail("parallel", f"{', '.join(too_big)}: does not divide the {workers.nproc} worker ranks")
    case.hf_model.save_pretrained(folder / "hf")
    tp_max = max(tp for tp, _ in layouts)
    convert(folder / "hf", folder / "mcore", "mcore", tp=tp_max)
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(0, case.mcore_config["vocab_size"], (2, 12), generator=gen)
    inputs = {}
    if case.family.vision is not None:  # the example batch with images, through the tower on the first stage
        ids, inputs = vision_example(case)
    reference = load(folder / "mcore", backend="mcore").logits(ids, **inputs)
    try:
        logits = workers.run(layout_logits, str(folder / "mcore"), list(layouts), ids, inputs=inputs)[0]
    except WorkerError as exc:
        _fail("parallel", f"{names}: {exc}")
    deltas = {}
    for tp, pp in layouts:
        got = logits[(tp, pp)]
        if got.shape != reference.shape:
            _fail("parallel", f"tp={tp} pp={pp}: logits shape {tuple(got.shape)} != {tuple(reference.shape)}")
        delta = (got - reference).abs().max().item()
        if not delta <= atol:
            _fail("parallel", f"tp={tp} pp={pp}: max |logits delta| vs one process = {delta:.3g} > {atol:g}")
        deltas[(tp, pp)] = delta
    return deltas
