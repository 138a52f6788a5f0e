"""The conformance checks, as plain functions that raise :class:`ConformanceFailure`.

The pytest suite (:mod:`pai_zoo_conformance.suite`) calls them on a family's ``tiny``
preset; they can also be called directly, e.g. on a deliberately broken family.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pai_zoo.errors import MappingError
from pai_zoo.family import Family
from pai_zoo.mapping import TO_HF, TO_MCORE, MappingContext

from .parallel_worker import layout_logits
from .workers import WorkerError, shared_workers

#: Mixed text for the tokenizer check: ASCII, CJK, emoji, whitespace runs, leading space.
MIXED_TEXT = (
    " Hello, world! The quick brown fox.\n\n  Indented\tline\t\twith tabs\n你好，世界。日本語のテキスト🙂🚀   end  "
)

#: The fixed forward-equivalence bound used before (float32, CPU). The forward check now uses the rule of
#: ``convert --verify`` (:func:`pai_zoo.verification.compare_logits`: max |delta| <= atol + rtol x max |logits|,
#: float32's defaults), whose bound on every tiny preset is below this (tests/test_verify.py asserts it); plugin
#: tests still compare with it.
LOGITS_ATOL = 1e-4


class ConformanceFailure(AssertionError):
    """A family does not conform; the message says which check and what differs."""


def _fail(check: str, message: str):
    raise ConformanceFailure(f"[{check}] {message}")


@dataclass
class Case:
    """A family's preset built in both backends with the same weights."""

    family: Family
    preset: str
    hf_config: Any
    mcore_config: Any
    hf_model: Any
    mcore_model: Any


def build_case(family: Family, preset: str | None = None, seed: int = 0, **overrides) -> Case:
    """Random-initialise the transformers model of ``preset`` (default: the tiny one), build the
    megatron-core model and load the same weights into it through the family's table."""
    import torch

    from pai_zoo import hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel
    from pai_zoo.weights import hf_model_to_mcore

    preset = preset or family.tiny
    config = {**family.presets[preset], **overrides}
    hf_config = hf.hf_config(family, config)
    torch.manual_seed(seed)
    hf_model = hf.build_hf_model(family, hf_config)
    mcore_config = family.to_mcore_config(hf.config_dict(hf_config))
    _randomise(hf_model, seed, norm_identity=0.0 if zero_centered_norms(family, mcore_config) else 1.0)
    ensure_model_parallel()
    mcore_model = build_gpt_model(family, mcore_config).eval()
    try:
        hf_model_to_mcore(family, mcore_config, hf_model, mcore_model)
    except MappingError as exc:
        _fail("mapping", f"{preset}: loading the transformers weights into megatron-core failed: {exc}")
    return Case(family, preset, hf_config, mcore_config, hf_model, mcore_model)


#: The cases :func:`shared_case` built in this process: (id(family), preset, seed) -> (family, case).
_SHARED_CASES: dict[tuple, tuple[Family, Case]] = {}


def shared_case(family: Family, preset: str | None = None, seed: int = 0) -> Case:
    """:func:`build_case` of ``family``'s ``preset`` and ``seed``, built once per process and shared by every test
    that only reads it (the conformance suite's checks copy a model before they train or change it). A test that
    changes a model takes :func:`copy_case` of it, or builds its own. The key is the family object itself: a family
    registered afresh, or a deliberately broken copy, gets a case of its own."""
    key = (id(family), preset or family.tiny, seed)
    hit = _SHARED_CASES.get(key)
    if hit is None or hit[0] is not family:
        hit = _SHARED_CASES[key] = (family, build_case(family, preset, seed))
    return hit[1]


def copy_case(case: Case) -> Case:
    """A copy of ``case`` that a test may change: the transformers model and the configs deep-copied, the
    megatron-core model built afresh with the same weights (its modules hold process groups, which do not copy)."""
    import copy
    import dataclasses

    from pai_zoo.mcore.build import build_gpt_model

    mcore_model = build_gpt_model(case.family, case.mcore_config).eval()
    mcore_model.load_state_dict(case.mcore_model.state_dict())
    return dataclasses.replace(case, hf_config=copy.deepcopy(case.hf_config), mcore_config=copy.deepcopy(
        case.mcore_config), hf_model=copy.deepcopy(case.hf_model), mcore_model=mcore_model)


def zero_centered_norms(family: Family, mcore_config) -> bool:
    """Whether the family's norms scale by ``1 + weight``: :attr:`Family.zero_centered_norms`, else the arch's
    ``layernorm_zero_centered_gamma``."""
    if family.zero_centered_norms is not None:
        return bool(family.zero_centered_norms)
    return bool(mcore_config.get("layernorm_zero_centered_gamma", False))


def _randomise(model, seed: int, norm_identity: float = 1.0) -> None:
    """Re-draw every weight so that the check is sensitive: matrices with std 1/sqrt(fan-in)
    (unit-scale activations, so attention is sharp and positions matter, unlike the tiny
    default init), norm weights near the norm's identity (``norm_identity``: 1, or 0 for norms that
    scale by ``1 + weight``, so that their gain is near 1 too and the margin does not depend on the
    seed) and biases near zero but all distinct (a router's ``e_score_correction_bias`` buffer too), so that a
    table swapping two tensors cannot pass unnoticed."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(norm_identity + 0.1 * noise)
        for name, b in model.named_buffers():  # a MoE router's score-correction bias: a buffer, zero at init
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def odd_preset(family: Family) -> str:
    """The family's ``odd`` preset (unusual shapes); a family without one does not conform."""
    if family.odd is None:
        _fail("odd", f"family {family.name!r} declares no odd preset (Family.odd): a small preset with a head count "
                     "that is not a power of two, a GQA ratio of 3, a vocabulary that is no multiple of 128, "
                     "head_dim != hidden/heads and biases, wherever the family allows them")
    return family.odd


# -- checks -----------------------------------------------------------------------------------
def check_registration(family: Family) -> None:
    """Entry point, names, presets and hooks."""
    from pai_zoo.registry import get_registry

    registry = get_registry()
    if not family.plugin or family.plugin not in registry.plugins:
        _fail("registration", f"family {family.name!r} was not registered through a 'pai_zoo' entry point")
    if not registry.plugins[family.plugin].distribution:
        _fail("registration", f"plugin {family.plugin!r} has no installed distribution")
    for name in family.names:
        if registry.family(name) is not family:
            _fail("registration", f"name {name!r} does not resolve to family {family.name!r}")
    if not family.hf_architectures or not family.model_types:
        _fail("registration", f"family {family.name!r} claims no Hugging Face architectures or model types")
    for preset in family.presets:
        if registry.preset(preset)[0] is not family:
            _fail("registration", f"preset {preset!r} does not resolve to family {family.name!r}")
    config = family.to_mcore_config(_hf_dict(family, family.tiny))
    if registry.weight_map(family, config) is None:
        _fail("registration", "no weight map for the tiny preset")


def _hf_dict(family: Family, preset: str) -> dict:
    from pai_zoo import hf

    return hf.config_dict(hf.hf_config(family, family.presets[preset]))


def check_preset_matches_published(family: Family, preset: str, published: dict) -> None:
    """``preset`` is the architecture of a published ``config.json`` (``published``, as its repository has it):
    both translate to the same megatron-core config, field by field."""
    ours = family.to_mcore_config(_hf_dict(family, preset)).arch
    from pai_zoo import hf

    theirs = family.to_mcore_config(hf.config_dict(hf.hf_config(family, published))).arch
    absent = "<absent>"
    diff = {k: (ours.get(k, absent), theirs.get(k, absent)) for k in sorted(ours.keys() | theirs.keys())
            if ours.get(k, absent) != theirs.get(k, absent)}
    if diff:
        _fail("preset", f"{preset}: fields differ from the published config.json (preset, published): {diff}")


def check_config_round_trip(family: Family, preset: str) -> None:
    """HF -> mcore -> HF keeps every field; every architecture field is translated, not carried."""
    from pai_zoo import hf
    from pai_zoo.config_map import McoreConfig

    original = _hf_dict(family, preset)
    untranslated = family.config_map.untranslated_architecture_keys(original)
    if untranslated:
        _fail("config", f"{preset}: architecture fields not translated to megatron-core: {untranslated}")
    mcore = family.to_mcore_config(original)
    stored = McoreConfig.from_json(mcore.to_json())
    back = hf.config_dict(hf.hf_config_from_mcore(family, stored))
    diff = {k: (original.get(k, "<absent>"), back.get(k, "<absent>"))
            for k in original.keys() | back.keys() if original.get(k, "<absent>") != back.get(k, "<absent>")}
    if diff:
        _fail("config", f"{preset}: HF -> mcore -> HF changed fields (before, after): {diff}")
    if family.to_mcore_config(back).arch != mcore.arch:
        _fail("config", f"{preset}: mcore -> HF -> mcore changed the megatron-core config")


def check_mapping_coverage(case: Case) -> None:
    """The table consumes every source tensor once and fills every target once, both ways."""
    from pai_zoo.errors import MappingError
    from pai_zoo.registry import get_registry
    from pai_zoo.weights import hf_state_dict, mcore_tensors

    table = get_registry().weight_map(case.family, case.mcore_config)
    ctx = MappingContext.from_config(case.mcore_config)
    hf_names = list(hf_state_dict(case.hf_model, case.mcore_config, case.family))  # checkpoint names (experts split)
    mcore_names = list(mcore_tensors(case.mcore_model))
    try:
        table.check_coverage(TO_MCORE, ctx, hf_names, mcore_names)
        table.check_coverage(TO_HF, ctx, mcore_names, hf_names)
    except MappingError as exc:
        _fail("mapping", str(exc))


def check_weight_round_trip(case: Case) -> float:
    """HF weights -> mcore -> HF are bit-identical. Returns max |delta| (0.0)."""
    from pai_zoo.weights import hf_state_dict, hf_to_mcore, mcore_to_hf

    original = hf_state_dict(case.hf_model, case.mcore_config, case.family)
    there = hf_to_mcore(case.family, case.mcore_config, original)
    back = mcore_to_hf(case.family, case.mcore_config, there)
    if set(back) != set(original):
        _fail(
            "weights",
            f"names differ: missing {sorted(set(original) - set(back))}, extra {sorted(set(back) - set(original))}",
        )
    changed = [k for k in original if original[k].shape != back[k].shape or not original[k].equal(back[k])]
    if changed:
        _fail("weights", f"HF -> mcore -> HF changed tensors: {changed}")
    return 0.0


def check_forward_equivalence(case: Case, batch: int = 2, seq_len: int = 16, atol: float | None = None) -> float:
    """Logits of the transformers and megatron-core models agree by :func:`pai_zoo.verification.compare_logits`
    (float32: max |delta| <= atol + rtol x max |logits|; a given ``atol``: that absolute bound) with the same
    argmax everywhere, at positions from 0 and at far positions (where RoPE scaling and
    long-range position handling show). Returns max |delta|."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.verification import compare_logits

    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    max_positions = case.mcore_config.get("max_sequence_length") or seq_len
    far = max(0, min(max_positions - seq_len, 256))  # far enough for RoPE; float32 angles stay exact to ~1e-5
    worst = 0.0
    for offset in sorted({0, far}):
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
    from pai_zoo.handle import ModelHandle

    return (ModelHandle(case.hf_model, case.family, "hf", case.hf_config, case.mcore_config),
            ModelHandle(case.mcore_model, case.family, "mcore", case.hf_config, case.mcore_config))


def _check_vision_forward(case: Case, atol: float | None) -> float:
    """The example batch with images (and videos): transformers' logits and megatron-core's agree as the text
    ones must."""
    from pai_zoo.verification import compare_logits

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


def check_variant(family: Family, preset: str | None = None, *, generation: bool = False, **overrides) -> float:
    """A variant of ``preset`` (default: the tiny one; ``overrides`` on its config): built in both backends, the
    table covers it both ways, the weights round-trip bit-identically and the logits agree
    (:func:`check_forward_equivalence`); with ``generation``, greedy generation too (:func:`check_generation`).
    Returns max |logits delta|."""
    case = build_case(family, preset, **overrides)
    check_mapping_coverage(case)
    check_weight_round_trip(case)
    delta = check_forward_equivalence(case)
    if generation:
        check_generation(case)
    return delta


def _test_tokenizers(family: Family, folder: Path):
    """The family's test tokenizer written into ``folder``: pai-zoo's adapter and transformers' AutoTokenizer."""
    from transformers import AutoTokenizer

    from pai_zoo.tokenizers.names import family_tokenizer

    if family.test_tokenizer is None:
        _fail("tokenizer", f"family {family.name!r} provides no test tokenizer (Family.test_tokenizer)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    family.test_tokenizer(folder)
    return family_tokenizer(family, folder), AutoTokenizer.from_pretrained(folder)


def check_tokenizer(family: Family, folder: Path, text: str = MIXED_TEXT) -> None:
    """The family's tokenizer adapter encodes like transformers' AutoTokenizer and decodes back."""


    ours, reference = _test_tokenizers(family, folder)
    for sample in (text, text.strip(), "a", "  "):
        got, expected = ours.encode(sample), reference(sample)["input_ids"]
        if got != expected:
            _fail("tokenizer", f"ids for {sample!r} differ from AutoTokenizer:\n  ours {got}\n  hf   {expected}")
    plain = ours.encode(text, add_special_tokens=False)
    if ours.decode(plain) != reference.decode(plain):
        _fail("tokenizer", f"decode differs from AutoTokenizer: {ours.decode(plain)!r} != {reference.decode(plain)!r}")
    # SentencePiece's dummy prefix makes a leading space unrecoverable; everything else must come back.
    body = text.lstrip(" ")
    if ours.decode(ours.encode(body, add_special_tokens=False)) != body:
        _fail(
            "tokenizer", f"decode(encode(text)) != text: {ours.decode(ours.encode(body, add_special_tokens=False))!r}"
        )


def _model_token_ids(family: Family) -> dict[str, dict[str, set]]:
    """The BOS/EOS/PAD ids the tiny preset's ``config.json`` and ``generation_config.json`` declare:
    ``{"bos": {"config.json": {1}, "generation_config.json": {1}}, ...}`` (a list of EOS ids is a set; unset
    ids are left out)."""
    from transformers import GenerationConfig

    from pai_zoo import hf

    hf_config = hf.hf_config(family, family.presets[family.tiny])
    sources = {"config.json": hf.config_dict(hf_config)}
    try:
        sources["generation_config.json"] = GenerationConfig.from_model_config(hf_config).to_dict()
    except Exception:  # a config class transformers cannot derive a generation config from: config.json only
        pass
    declared: dict[str, dict[str, set]] = {}
    for kind in ("bos", "eos", "pad"):
        for source, values in sources.items():
            value = values.get(f"{kind}_token_id")
            if value is None:
                continue
            ids = set(value) if isinstance(value, (list, tuple)) else {value}
            declared.setdefault(kind, {})[source] = {int(i) for i in ids}
    return declared


def check_tokenizer_against_model(family: Family, folder: Path) -> None:
    """The family's test tokenizer (written into ``folder``) fits the model, in pai-zoo's adapter and in
    ``AutoTokenizer``:

    - its BOS/EOS/PAD ids are those the tiny preset's ``config.json`` and ``generation_config.json`` declare
      (EOS: one of them when they list several), wherever both sides have one;
    - when ``tokenizer_config.json`` says ``add_bos_token: true``, encoding starts with BOS;
    - every special token ``tokenizer_config.json`` declares (``added_tokens_decoder``, ``bos_token``, ...) maps
      to its declared id, in both adapters."""
    import json

    ours, reference = _test_tokenizers(family, folder)
    declared = _model_token_ids(family)
    for kind, by_source in declared.items():
        got = getattr(ours, f"{kind}_id")
        if got is None:
            continue
        for source, ids in by_source.items():
            if got not in ids:
                _fail("tokenizer", f"{kind.upper()} id {got} ({getattr(ours, f'{kind}_token')!r}) is not the "
                                   f"{kind}_token_id {sorted(ids)} of {family.tiny}'s {source}")
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if config.get("add_bos_token") is True:
        bos = ours.bos_id
        first = ours.encode("a")[:1]
        if bos is None or first != [bos]:
            _fail("tokenizer", f"tokenizer_config.json says add_bos_token, but encode('a') starts with {first} "
                               f"(BOS {ours.bos_token!r} = {bos})")
    named = {int(i): entry["content"] for i, entry in (config.get("added_tokens_decoder") or {}).items()
             if isinstance(entry, dict) and "content" in entry}
    expected = {token: i for i, token in named.items()}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            expected.setdefault(token, None)
    for token, want in expected.items():
        got, theirs = ours.token_to_id(token), reference.convert_tokens_to_ids(token)
        if got is None:
            _fail("tokenizer", f"special token {token!r} of tokenizer_config.json is not in the vocabulary")
        if want is not None and got != want:
            _fail("tokenizer", f"special token {token!r} has id {got}; tokenizer_config.json declares {want}")
        if got != theirs:
            _fail("tokenizer", f"special token {token!r} has id {got}; AutoTokenizer gives {theirs}")


def check_training(case: Case, steps: int = 8, lr: float = 3e-3) -> tuple[float, float]:
    """A few optimizer steps on the megatron-core model (its own loss) lower the loss on a
    fixed batch. Returns (first loss, last loss)."""
    import torch

    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.forward import causal_mask

    model = build_gpt_model(case.family, case.mcore_config)
    model.load_state_dict(case.mcore_model.state_dict())
    model.train()
    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, vocab, (2, 17), generator=gen)
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    mask, positions = causal_mask(ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(ids, positions, mask, labels=labels).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if not all(map(torch.isfinite, map(torch.tensor, losses))):
        _fail("training", f"non-finite loss: {losses}")
    if not losses[-1] < 0.9 * losses[0]:
        _fail("training", f"loss did not fall by 10% in {steps} steps: {losses}")
    return losses[0], losses[-1]


#: Tolerance between a tensor/pipeline-parallel model's logits and the single-process ones.
PARALLEL_ATOL = 1e-5
#: The layouts the parallel check runs, each with 2 processes.
PARALLEL_LAYOUTS = ((2, 1), (1, 2))


def check_disk_round_trip(case: Case, folder: Path) -> float:
    """HF folder -> Megatron-Core checkpoint -> HF folder: bit-identical tensors, equal config. Returns max
    |delta| (0.0)."""
    import torch
    from safetensors.torch import load_file

    from pai_zoo import hf
    from pai_zoo.conversion import convert

    folder = Path(folder)
    case.hf_model.save_pretrained(folder / "hf")
    convert(folder / "hf", folder / "mcore", "mcore")
    convert(folder / "mcore", folder / "hf-again", "hf")

    def tensors(path):
        out = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            out.update(load_file(file))
        return out

    before, after = tensors(folder / "hf"), tensors(folder / "hf-again")
    if before.keys() != after.keys():
        _fail("disk", f"tensor names differ: missing {sorted(before.keys() - after.keys())}, "
                      f"extra {sorted(after.keys() - before.keys())}")
    changed = [k for k in before if before[k].dtype != after[k].dtype or not torch.equal(before[k], after[k])]
    if changed:
        _fail("disk", f"HF -> mcore -> HF on disk changed tensors: {changed}")
    ignore = {"transformers_version", "_name_or_path"}
    configs = [
        {
            k: v
            for k, v in hf.config_dict(hf.hf_config(case.family, _read_json(f / "config.json"))).items()
            if k not in ignore
        }
        for f in (folder / "hf", folder / "hf-again")
    ]
    diff = {k: (configs[0].get(k), configs[1].get(k)) for k in configs[0].keys() | configs[1].keys()
            if configs[0].get(k) != configs[1].get(k)}
    if diff:
        _fail("disk", f"config.json changed (before, after): {diff}")
    return 0.0


def _read_json(path: Path) -> dict:
    import json

    return json.loads(Path(path).read_text())


def check_parallel_equivalence(case: Case, folder: Path, layouts=PARALLEL_LAYOUTS, atol: float = PARALLEL_ATOL,
                               workers=None) -> dict:
    """Logits of the model loaded with each ``(tp, pp)`` layout (by the 2 gloo ranks of ``workers``, default the
    session's :func:`~pai_zoo_conformance.workers.shared_workers`) equal the single-process logits within ``atol``.
    Returns max |delta| per layout."""
    import torch

    import pai_zoo
    from pai_zoo.conversion import convert

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
    reference = pai_zoo.load(folder / "mcore", backend="mcore").logits(ids, **inputs)
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


#: Greedy-generation check: a divergence is accepted only where transformers' own logits make
#: our token a near-tie with its argmax (within twice the forward tolerance, see check_generation).
GENERATION_TIE_TOL = 2 * LOGITS_ATOL


def check_generation(case: Case, new_tokens: int = 16, lengths=(5, 11, 1, 8), seed: int = 4321,
                     tie_tol: float = GENERATION_TIE_TOL) -> dict:
    """Greedy generation with the megatron-core model (pai-zoo's KV-cached loop, left-padded
    batch) equals transformers' ``generate`` on the same weights, token for token, for prompts
    of different ``lengths`` (EOS disabled on both sides, so every row has ``new_tokens``).

    Random tiny models can have near-ties: two logits closer than the two backends' float
    rounding (the forward check allows ``LOGITS_ATOL`` per logit, so a gap below
    ``2 * LOGITS_ATOL`` may flip). Where a row differs, it still passes only if, teacher-forced
    on *our* tokens, transformers' full forward puts each of our tokens within ``tie_tol`` of its
    own maximum at every step -- a real error (wrong mask, position or cache) gives gaps orders of
    magnitude larger. Returns ``{"rows": n, "tie_rows": rows rescued by the near-tie rule,
    "max_gap": largest such gap}``.
    """
    import torch

    from pai_zoo.generation import Finisher, SamplingParams, hf_generate, left_pad, mcore_generate

    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    params = SamplingParams(max_new_tokens=new_tokens)
    ours = [Finisher(params, (), None) for _ in prompts]
    theirs = [Finisher(params, (), None) for _ in prompts]
    mcore_generate(case.mcore_model, prompts, params, ours, vocab_size=vocab)
    hf_generate(case.hf_model, prompts, params, theirs)
    for row, (a, b) in enumerate(zip(ours, theirs)):
        if len(a.tokens) != new_tokens or len(b.tokens) != new_tokens:
            _fail("generation", f"row {row}: expected {new_tokens} tokens, got {len(a.tokens)} (mcore) and "
                                f"{len(b.tokens)} (transformers)")
    differing = [row for row, (a, b) in enumerate(zip(ours, theirs)) if a.tokens != b.tokens]
    max_gap = 0.0
    if differing:
        ids, keep = left_pad([prompts[r] + ours[r].tokens for r in differing])
        positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = case.hf_model(input_ids=ids, attention_mask=keep.long(), position_ids=positions).logits.float()
        steps = logits[:, -new_tokens - 1:-1, :vocab]  # the logits that chose each new token
        chosen = ids[:, -new_tokens:]
        gaps = steps.max(-1).values - steps.gather(-1, chosen[..., None]).squeeze(-1)
        for k, row in enumerate(differing):
            worst = gaps[k].max().item()
            if not worst <= tie_tol:
                step = int((gaps[k] > tie_tol).nonzero()[0])
                _fail("generation", f"prompt of {lengths[row]} tokens: greedy tokens differ from transformers' "
                                    f"generate\n  mcore {ours[row].tokens}\n  hf    {theirs[row].tokens}\n"
                                    f"  and step {step} is no near-tie: transformers' logit of our token is "
                                    f"{gaps[k][step].item():.3g} below its maximum (> {tie_tol:g})")
            max_gap = max(max_gap, worst)
    if case.family.vision is not None:
        _check_vision_generation(case, new_tokens)
    return {"rows": len(prompts), "tie_rows": len(differing), "max_gap": max_gap}


def _check_vision_generation(case: Case, new_tokens: int) -> None:
    """The example batch with images (and videos) beside a text prompt in one left-padded batch: pai-zoo's loop
    (the tower in the prompt's forward, M-RoPE ids counting on after it) gives transformers' greedy tokens."""
    from functools import partial

    from pai_zoo.generation import Finisher, SamplingParams, hf_generate, mcore_generate
    from pai_zoo.generation.images import decode_positions

    ids, inputs = vision_example(case)
    prompts = [ids[0].tolist(), ids[0, :3].tolist()]  # with the vision inputs, and a text prompt beside it
    params = SamplingParams(max_new_tokens=new_tokens)
    ours, theirs = [Finisher(params, (), None) for _ in prompts], [Finisher(params, (), None) for _ in prompts]
    _, mcore = _handles(case)
    mcore_generate(case.mcore_model, prompts, params, ours, vocab_size=case.mcore_config["vocab_size"],
                   vision=(inputs, partial(decode_positions, case.family.vision, case.mcore_config)))
    hf_generate(case.hf_model, prompts, params, theirs, inputs=lambda padded: {**inputs,
                                                                             **mcore.vision_token_types(padded)})
    for row, (a, b) in enumerate(zip(ours, theirs)):
        if a.tokens != b.tokens:
            _fail("generation", f"with {', '.join(sorted(inputs))}, row {row}: greedy tokens differ from "
                                f"transformers' generate\n  mcore {a.tokens}\n  hf    {b.tokens}")


def check_lora(case: Case, rank: int = 4, seed: int = 7) -> float:
    """A random PEFT LoRA adapter on every linear the family's table makes adaptable, made and applied by the real
    ``peft`` on the transformers model, gives the same logits through pai-zoo's LoRA on the megatron-core model
    (:func:`pai_zoo.verification.compare_logits`, float32), moves them far more than that tolerance, and comes back
    from pai-zoo's mcore form bit for bit. Returns max |delta|."""
    import copy

    import torch

    try:
        import peft
    except ImportError:
        _fail("lora", "peft is not installed (pip install peft): the LoRA check runs against it")
    from pai_zoo.lora.settings import LoraError, LoraSettings
    from pai_zoo.lora.targets import lora_targets, to_hf_form, to_mcore_form
    from pai_zoo.mapping import MappingContext
    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.mcore.lora import add_lora
    from pai_zoo.registry import get_registry
    from pai_zoo.verification import compare_logits

    targets = lora_targets(get_registry().weight_map(case.family, case.mcore_config))
    leaves = sorted({leaf for t in targets for leaf in t.leaves})
    if not leaves:
        _fail("lora", "the family's table maps no decoder linear from HF projections: nothing for LoRA to adapt")
    ctx = MappingContext.from_config(case.mcore_config)
    # the projections by their full module names (PEFT also maps leaf names such as gate_proj onto transformers'
    # fused routed experts, which pai-zoo does not adapt)
    modules = dict(case.hf_model.named_modules())
    family = case.family
    names = sorted(family.hf_module_name(h.replace("{layer}", str(layer))) for t in targets
                   for layer in ctx.layers_of(t.row.layer_kind) for h in t.hf)
    absent = [n for n in names if not isinstance(modules.get(n), torch.nn.Linear)]
    if absent:
        _fail("lora", f"the table's projections {absent[:3]} are no torch.nn.Linear of the transformers model: PEFT "
                      "names adapters by module, so an adapter would not map")
    torch.manual_seed(seed)
    hf_model = peft.get_peft_model(copy.deepcopy(case.hf_model), peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=names, init_lora_weights=False)).eval()
    # PEFT maps gate_proj/up_proj onto transformers' fused routed experts too (a ParamWrapper): those adapters
    # are set to do nothing, as pai-zoo does not adapt routed experts
    prefix = "base_model.model."
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if ".lora_B." in name and name[len(prefix):].split(".lora_B.")[0] not in names:
                param.zero_()
    state = {k: v for k, v in peft.get_peft_model_state_dict(hf_model).items()
             if k[len(prefix):].rsplit(".lora_", 1)[0] in names}
    adapters: dict = {}
    for name, tensor in state.items():
        module, part = name[len(prefix):].rsplit(".lora_", 1)
        adapters.setdefault(module, [None, None])[0 if part.startswith("A") else 1] = tensor.detach().clone()
    adapters = {m: tuple(pair) for m, pair in adapters.items()}
    for name in names:  # a projection PEFT's target-name conversion left unadapted: a zero update for pai-zoo
        if name not in adapters:
            out, inp = modules[name].weight.shape
            adapters[name] = (torch.zeros(rank, inp), torch.zeros(out, rank))
    # the table's names (checkpoint names) for pai-zoo, from PEFT's module names
    adapters = {family.hf_checkpoint_name(m): pair for m, pair in adapters.items()}
    try:
        mcore_form = to_mcore_form(adapters, targets, case.mcore_config, ctx)
    except LoraError as exc:  # a table row that does not place rows as megatron-core holds them
        _fail("lora", f"PEFT's adapters ({sorted(adapters)[:2]} ...) do not map onto megatron-core: {exc}")
    back = to_hf_form(mcore_form, targets, case.mcore_config, ctx)
    if set(back) != set(adapters) or any(not torch.equal(back[m][i], adapters[m][i]) for m in adapters for i in (0, 1)):
        _fail("lora", "the adapters do not come back bit for bit from megatron-core's form")
    settings = LoraSettings(rank=rank, alpha=2.0 * rank, targets=tuple(leaves))
    lora = copy_case(case)
    add_lora(lora.mcore_model, case.family, case.mcore_config, settings, adapters=mcore_form, where="the check")
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        expected = hf_model(input_ids=ids).logits.float()
        plain = case.hf_model(input_ids=ids).logits.float()
        got = mcore_forward(lora.mcore_model, ids)[..., :vocab].float()
    result = compare_logits(expected, got, "fp32")
    if not result["ok"]:
        _fail("lora", f"logits with the adapter: max |delta| = {result['max_abs_delta']:.3g} > "
                      f"{result['tolerance']:.3g} against PEFT's")
    if (plain - expected).abs().max().item() <= 100 * result["tolerance"]:
        _fail("lora", "the random adapter barely moves the logits: the check would not see a misplaced row")
    return result["max_abs_delta"]
