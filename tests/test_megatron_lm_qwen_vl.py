"""Megatron-LM's multimodal checkpoints are refused in one line that names the model they hold: its Qwen3-VL layout
(pretrain_qwenvl.py's Qwen3VLModel: ``language_model.*`` and transformers' visual module under ``visual.visual.*``,
``args.vision_model_type="qwen3_vl"``) and its LLaVA layout (``vision_model.*``, ``vision_projection.*``, a SigLIP
tower). No NVIDIA fixture of either exists (../shared/megatron-lm-fixtures holds Llama ones), so the test writes the
layout itself: a legacy Megatron-LM checkpoint of a Qwen3 language model (tests/megatron_lm_writer.py) with its
tensors moved under ``language_model.`` and a Qwen3-VL tower's tensors added under transformers' names.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_lm_writer import write_legacy  # noqa: E402

pytestmark = pytest.mark.megatron_once  # pai-zoo's own reading of the args and names


def _multimodal(root: Path, kind: str, tower: dict) -> Path:
    hf = pai_zoo.load("qwen3-tiny", backend="hf", seed=1)
    it = write_legacy(hf.model, hf.model.config, root, with_rng=False,
                      args_overrides={"vision_model_type": kind, "hf_model_name": "Qwen/Qwen3-VL-2B-Instruct"})
    for file in it.glob("mp_rank_*/model_optim_rng.pt"):
        state = torch.load(file, weights_only=False)
        state["model"] = {**{f"language_model.{k}": v for k, v in state["model"].items()}, **tower}
        torch.save(state, file)
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm-vl")
    visual = pai_zoo.load("qwen3_vl-tiny", backend="hf", seed=1).model.model.visual.state_dict()
    qwen = _multimodal(root / "qwen3vl", "qwen3_vl", {f"visual.visual.{k}": v for k, v in visual.items()})
    llava = _multimodal(root / "llava", "siglip", {"vision_model.decoder.layers.0.mlp.linear_fc1.weight":
                                                   torch.zeros(8, 4), "vision_projection.encoder.linear_fc1.weight":
                                                   torch.zeros(8, 4)})
    return qwen, llava


@pytest.mark.parametrize("command", [["convert", "{src}", "{dst}", "--to", "hf"], ["inspect", "{src}"]])
def test_multimodal_checkpoints_are_refused_in_one_line(folders, command, tmp_path):
    qwen, llava = folders
    for src, wanted in ((qwen, ["a Megatron-LM Qwen-VL checkpoint (args.vision_model_type='qwen3_vl'",
                                "visual.visual.*", "Qwen/Qwen3-VL-2B-Instruct", "qwen3_vl/qwen3_vl_moe"]),
                        (llava, ["a Megatron-LM LLaVA checkpoint (args.vision_model_type='siglip'",
                                 "vision_model.*, vision_projection.*", "no Qwen-VL model"])):
        out = tmp_path / f"{src.name}-hf"
        proc = run_cli([a.format(src=src, dst=out) for a in command])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert all(w in lines[0] for w in wanted), lines[0]
        assert not out.exists()


def test_the_refusal_names_what_is_missing():
    from pai_zoo.formats.megatron_lm_multimodal import multimodal_refusal

    assert multimodal_refusal("f", ["embedding.word_embeddings.weight"], {}) is None  # a GPT checkpoint
    line = multimodal_refusal("f", ["language_model.embedding.word_embeddings.weight"], {})
    assert "without args.vision_model_type" in line and "\n" not in line
