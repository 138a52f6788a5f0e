"""Measurement: the generated package is imported from a temporary folder, and its family is run through the
conformance suite's own checks (:mod:`pai_zoo_conformance.checks`: the same random weights in both backends, the
suite's tolerance). When the logits differ, the known variants that keys and names cannot show are tried, alone
and combined, and the first that passes on the tiny and the odd preset is kept."""
from __future__ import annotations

import importlib.util
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

from pai_zoo.models.verification import compare_logits

from ..plugin.errors import PaiZooError
from .draft import Draft
from .mechanisms import RULE_VARIANTS
from .render import package_init, presets_module

#: What a Llama-shaped HF model may compute differently without a config key or a tensor to show it:
#: ``(arch key, value, what it means)``.
VARIANTS = (
    ("rotary_interleaved", True, "rotates interleaved pairs (x0, x1), (x2, x3) ... of each head, not its halves"),
    ("layernorm_zero_centered_gamma", True, "its RMSNorms scale by 1 + weight"),
    ("pai_zoo.embedding_scale", "sqrt_hidden_size", "multiplies the word embeddings by sqrt(hidden_size)"),
)

#: The prefix of a :data:`~pai_zoo.scaffold.mechanisms.RULE_VARIANTS` entry among ``Draft.variants``' keys.
RULE = "rule:"

_COUNTER = itertools.count()


def load_family(draft: Draft, folder: Path):
    """Write the draft's package into ``folder`` and import it under a fresh name; its ``FAMILY``."""
    package = Path(folder) / f"candidate{next(_COUNTER)}" / draft.package
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(package_init(draft), encoding="utf-8")
    (package / "presets.py").write_text(presets_module(draft), encoding="utf-8")
    name = f"_pai_zoo_scaffold_{package.parent.name}"
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}.presets", None)
    return module.FAMILY


def forward(family) -> tuple[dict[str, float], str | None, Any]:
    """Mapping coverage and forward equivalence on the tiny and the odd preset: ``(max |delta| per preset, the
    first failure message or None, the case it failed on)``."""
    checks = _suite_checks()
    deltas: dict[str, float] = {}
    for preset in (family.tiny, family.odd):
        case = None
        try:
            case = checks.build_case(family, preset)
            checks.check_mapping_coverage(case)
            deltas[preset] = checks.check_forward_equivalence(case)
        except (checks.ConformanceFailure, PaiZooError) as exc:  # a rule refusing a preset value too
            return deltas, f"{preset}: {exc}", case
        except Exception as exc:  # a model that cannot run the preset (transformers' or megatron-core's)
            return deltas, f"{preset}: building or running the models failed: {type(exc).__name__}: {exc}", None
    return deltas, None, None


def config_failures(family) -> list[str]:
    """The suite's config check on every preset: its failure messages."""
    checks = _suite_checks()
    out = []
    for preset in family.presets:
        try:
            checks.check_config_round_trip(family, preset)
        except (checks.ConformanceFailure, PaiZooError) as exc:  # a rule refusing a preset value too
            out.append(f"{exc}")
    return out


def first_difference(case) -> str:
    """Where the two models first part: the embedding output, a layer's output, or only the logits."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward

    hf_out: dict[str, Any] = {}
    mc_out: dict[str, Any] = {}

    def grab(store, key, seq_first):
        def hook(module, inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            store[key] = (tensor.transpose(0, 1) if seq_first else tensor).detach().float()
        return hook

    keys = ["embedding"] + [f"layer {i}" for i in range(len(case.mcore_model.decoder.layers))]
    hooks = [case.hf_model.model.embed_tokens.register_forward_hook(grab(hf_out, "embedding", False)),
             case.mcore_model.embedding.register_forward_hook(grab(mc_out, "embedding", True))]
    for i, (a, b) in enumerate(zip(case.hf_model.model.layers, case.mcore_model.decoder.layers)):
        hooks += [a.register_forward_hook(grab(hf_out, f"layer {i}", False)),
                  b.register_forward_hook(grab(mc_out, f"layer {i}", True))]
    ids = torch.randint(0, case.mcore_config["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1234))
    try:
        with torch.no_grad():
            case.hf_model(input_ids=ids)
            mcore_forward(case.mcore_model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    for key in keys:
        if key in hf_out and key in mc_out and hf_out[key].shape == mc_out[key].shape:
            result = compare_logits(hf_out[key], mc_out[key], "fp32")
            if not result["ok"]:
                where = "the word embeddings" if key == "embedding" else f"the output of {key} (model.layers." \
                        f"{key.split()[1]} vs decoder.layers.{key.split()[1]})"
                return f"the first output that differs is {where}: max |delta| {result['max_abs_delta']:.3g}"
    return "every layer's output agrees: the final norm or the output head differs"


def search(draft: Draft) -> Draft:
    """Measure ``draft``; on differing logits try :data:`VARIANTS` (singly, then combined) and keep the first
    that passes. Fills ``draft.measured``, ``draft.variants``, ``draft.tried`` and, where nothing passes, a stub
    naming the first differing output."""
    with tempfile.TemporaryDirectory(prefix="pai-zoo-scaffold-") as folder:
        family = load_family(draft, Path(folder))
        failures = config_failures(family)
        if failures:  # the first preset's; the others fail alike
            draft.stubs.append(f"the suite's config check fails: {failures[0]}")
        deltas, failure, case = forward(family)
        draft.tried.append(f"as inferred: {'passes' if failure is None else failure.splitlines()[0]}")
        if failure is None:
            draft.measured = deltas
            return draft
        if "[forward]" not in failure:  # a table or build failure: no variant explains it
            draft.stubs.append(f"the inferred plugin fails before the logits can be compared: {failure}")
            return draft
        base_failure = failure
        where = first_difference(case) if case is not None else ""
        candidates = [(k, v, why) for k, v, why in VARIANTS if draft.mcore_fixed.get(k, None) != v]
        candidates += [(RULE + name, True, why) for name, (_, why, applies) in RULE_VARIANTS.items() if applies(draft)]
        for size in range(1, len(candidates) + 1):
            for combo in itertools.combinations(candidates, size):
                draft.variants = {k: v for k, v, _ in combo}
                deltas, failure, _ = forward(load_family(draft, Path(folder)))
                label = ", ".join(f"{k}={v!r}" for k, v, _ in combo)
                draft.tried.append(f"{label}: {'passes' if failure is None else failure.splitlines()[0]}")
                if failure is None:
                    draft.measured = deltas
                    before = base_failure.split("max |logits delta| = ")[-1].split(" ")[0]
                    for k, _, why in combo:
                        draft.variant_notes[k] = (f"found by measurement: transformers' model {why} (max |logits "
                                                  f"delta| {max(deltas.values()):.2g} with it, {before} without)")
                    return draft
        draft.variants = {}
        draft.stubs.append(f"the logits differ from transformers' and no known variant explains it ({base_failure}); "
                           f"{where}")
    return draft


def _suite_checks():
    """The conformance suite's checks, which measure a draft: an optional package (``plugin new`` refuses in one
    line without it, :func:`pai_zoo.scaffold.new_plugin`)."""
    try:
        from pai_zoo_conformance import checks
    except ImportError:  # pragma: no cover - new_plugin checks first
        raise PaiZooError("plugin new measures the plugin with the conformance suite, which is not installed "
                          "(pip install -e conformance)") from None
    return checks
