"""docs/writing-a-plugin.md's example plugin runs as the guide writes it (issue 18): its fenced code blocks are
written into a temporary package -- ``pyproject.toml``, ``pai_zoo_phi3/presets.py``, ``pai_zoo_phi3/__init__.py``
(its three parts in order), the tokenizer files from the guide's ``ByteLevelBPE`` example and the three-line
conformance test -- and the suite's quick checks run on the family it defines against transformers'
``Phi3ForCausalLM``: config round trip of every preset, mapping coverage, weight round trip, forward equivalence
(with its sliding window and partial rotary), both tokenizer checks, training and greedy generation. The guide's
zero-centred norm layer spec (``OffsetRMSNorm`` with ``block_spec``) is checked against transformers'
``GemmaForCausalLM``, and its embedding-level ``model_class`` example builds and scales the embeddings.

The package is imported from the temporary folder, not installed (an install would change the shared venv), so
the registration check and the torchrun checks are left to the families in plugins/; the entry point is checked
in the written ``pyproject.toml``."""
from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from pai_zoo_conformance import ConformanceFailure, checks

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"


def _blocks() -> list[tuple[str, str, str]]:
    """``(caption, language, code)`` of every fenced block; the caption is the last line before the fence."""
    text = DOC.read_text(encoding="utf-8")
    out = []
    for match in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
        caption = text[:match.start()].rstrip().split("\n")[-1]
        out.append((caption, match.group(1), match.group(2)))
    return out


def _files() -> dict[str, str]:
    """The example plugin's files, by path under ``pai-zoo-phi3/``, from the blocks captioned with that path."""
    files: dict[str, str] = {}
    for caption, _, code in _blocks():
        named = re.match(r"`pai-zoo-phi3/([\w/.]+)`( \((first part|continued)\))?:$", caption)
        if named:
            files[named.group(1)] = files.get(named.group(1), "") + ("\n\n" if named.group(1) in files else "") + code
    return files


def _block_starting(prefix: str) -> str:
    [code] = [code for _, lang, code in _blocks() if lang == "python" and code.startswith(prefix)]
    return code


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    root = tmp_path_factory.mktemp("doc-plugin") / "pai-zoo-phi3"
    files = _files()
    assert {"pyproject.toml", "pai_zoo_phi3/presets.py", "pai_zoo_phi3/__init__.py",
            "tests/test_conformance.py"} <= set(files), sorted(files)
    for name, code in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(code, encoding="utf-8")
    namespace: dict = {}
    exec(_block_starting("from pai_zoo.testing.tokenizers import"), namespace)  # the guide's tokenizer example
    namespace["write_test_tokenizer"](root / "pai_zoo_phi3" / "tokenizer")
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("pai_zoo_phi3")
        yield root, module
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "pai_zoo_phi3" or m.startswith("pai_zoo_phi3.")]:
            del sys.modules[name]


def test_the_written_package_is_the_guide_layout(phi3):
    root, module = phi3
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pai_zoo"] == {"phi3": "pai_zoo_phi3"}
    assert "class TestPhi3Conformance(ConformanceSuite)" in (root / "tests" / "test_conformance.py").read_text()
    assert module.PHI3.name == "phi3" and module.pai_zoo_families() == [module.PHI3]
    assert sorted(p.name for p in (root / "pai_zoo_phi3" / "tokenizer").iterdir()) == [
        "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.megatron
def test_the_example_passes_the_quick_checks(phi3, tmp_path):
    family = phi3[1].PHI3
    for preset in family.presets:
        checks.check_config_round_trip(family, preset)
    case = checks.build_case(family)
    checks.check_mapping_coverage(case)
    checks.check_weight_round_trip(case)
    assert checks.check_forward_equivalence(case) <= 1e-4
    checks.check_tokenizer(family, tmp_path / "a")
    checks.check_tokenizer_against_model(family, tmp_path / "b")
    checks.check_training(case)
    checks.check_generation(case)


@pytest.mark.megatron
def test_the_example_row_is_measured(phi3):
    """The guide's ``FusedQKV`` row matters: a plain ``Copy`` of ``qkv_proj`` (all query heads, then all keys,
    then all values, not megatron's per-group layout) loads the same shapes and fails the forward check."""
    from pai_zoo import Copy

    module = phi3[1]
    rows = [Copy(row.hf[0], row.mcore[0]) if type(row).__name__ == "FusedQKV" else row for row in module.WEIGHTS.rows]
    assert len(rows) == len(module.WEIGHTS.rows) and any(type(r).__name__ == "FusedQKV" for r in module.WEIGHTS.rows)
    broken = dataclasses.replace(module.PHI3, weight_map=type(module.WEIGHTS)(*rows))
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(broken))


@pytest.mark.megatron
def test_the_guide_layer_spec_is_gemma():
    """The guide's ``OffsetRMSNorm`` layer spec (norms and, through ``block_spec``, the final norm) on a
    Gemma-shaped family without the core's zero-centred option matches ``GemmaForCausalLM``."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import gemma_like
    finally:
        sys.path.remove(str(Path(__file__).parent))
    code = _block_starting("# pai_zoo_myfamily/modules.py")
    namespace: dict = {"__name__": "doc_layer_spec"}
    exec(code.replace("from .modules import OffsetRMSNorm", ""), namespace)  # one module: the class is there
    core = {k: v for k, v in gemma_like.CORE.items() if k != "layernorm_zero_centered_gamma"}
    family = gemma_like.family(core, layer_spec=namespace["layer_spec"], zero_centered_norms=True)
    case = checks.build_case(family)
    assert type(case.mcore_model.decoder.final_layernorm).__name__ == "OffsetRMSNorm"
    assert checks.check_forward_equivalence(case) <= 1e-4


@pytest.mark.megatron
def test_the_guide_model_class_scales_the_embeddings():
    """The guide's embedding-level ``model_class`` (a learnt per-channel gain on the embeddings) builds on a
    family and multiplies the embedding output by ``embedding.gain``."""
    import torch

    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel

    namespace: dict = {"__name__": "doc_model_class"}
    exec(_block_starting("# pai_zoo_myfamily/model.py"), namespace)
    llama = get_registry().family("llama")
    family = dataclasses.replace(llama, model_class=lambda config: namespace["gain_gpt_model"]())
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, family.presets[family.tiny])))
    ensure_model_parallel()
    model = build_gpt_model(family, config).eval()
    assert "embedding.gain" in model.state_dict()
    ids = torch.arange(6).view(1, 6)
    positions = torch.arange(6).view(1, 6)
    with torch.no_grad():
        plain = model.embedding(ids, positions)
        model.embedding.gain.fill_(2.0)
        doubled = model.embedding(ids, positions)
    assert torch.equal(doubled, 2 * plain)
