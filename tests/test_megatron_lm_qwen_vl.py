"""Megatron-LM's Qwen-VL checkpoints: its Qwen3-VL layout (pretrain_qwenvl.py's Qwen3VLModel: the language model
under ``language_model.``, transformers' visual module under ``visual.visual.``, ``args.vision_model_type="qwen3_vl"``)
is read as the qwen3_vl family, legacy ``torch`` (TP 1 and 2) and ``torch_dist`` (TP 2), and its MoE as
qwen3_vl_moe: the logits with images and
a video equal transformers' on the original model, and `convert --to hf` gives its tensors bit for bit. What cannot
be read is refused in one line: no Hugging Face folder for the tower's settings, a Qwen-VL checkpoint without its
tower, and Megatron-LM's LLaVA layout (``vision_model.*``, ``vision_projection.*``, a SigLIP tower).

No NVIDIA fixture of these layouts exists (../shared/megatron-lm-fixtures holds Llama ones): the test writes them
from the qwen3_vl-tiny model with tests/megatron_lm_writer.py (the language model as Megatron-LM writes a Qwen3 GPT
checkpoint), its keys moved under ``language_model.`` and the tower's transformers tensors added under
``visual.visual.`` (every tensor-parallel rank's file holds the replicated tower, as Megatron-LM's do).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pai_zoo
from pai_zoo_conformance.cli_runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_lm_writer as writer  # noqa: E402

pytestmark = pytest.mark.megatron_once  # pai-zoo's reading of the layout; the model's forward is checked every pass

LM, TOWER = "language_model.", "visual.visual."


def _text(hf) -> tuple[dict, dict]:
    """The Qwen3 language model of a Qwen3-VL model: its HF state and config, as the writer takes them."""
    config = hf.model.config.text_config.to_dict()
    moe = bool(config.get("num_experts") or config.get("num_local_experts"))
    config.update(model_type="qwen3_moe" if moe else "qwen3", tie_word_embeddings=hf.model.config.tie_word_embeddings)
    if moe:  # Qwen3-VL-MoE renormalizes the top-k weights (its config has no norm_topk_prob)
        config.setdefault("norm_topk_prob", True)
    sd = hf.model.state_dict()
    state = {k.replace("model.language_model.", "model."): v for k, v in sd.items()
             if k.startswith("model.language_model.")}
    if "lm_head.weight" in sd and not config["tie_word_embeddings"]:
        state["lm_head.weight"] = sd["lm_head.weight"]
    return state, config


def _args(config, hf_folder) -> dict:
    return {"vision_model_type": "qwen3_vl", "hf_model_name": str(hf_folder), "position_embedding_type": "mrope",
            "rotary_base": config["rope_parameters"]["rope_theta"]}


def _tower(hf) -> dict:
    return {TOWER + k[len("model.visual."):]: v for k, v in hf.model.state_dict().items()
            if k.startswith("model.visual.")}


def write_legacy_qwen_vl(hf, hf_folder, dst, tp=1, kind="qwen3_vl", tower=True) -> Path:
    state, config = _text(hf)
    it = writer.write_legacy(state, config, dst, tp=tp, with_rng=False,
                             args_overrides={**_args(config, hf_folder), "vision_model_type": kind})
    for file in it.glob("mp_rank_*/model_optim_rng.pt"):
        saved = torch.load(file, weights_only=False)
        saved["model"] = {**{LM + k: v for k, v in saved["model"].items()}, **(_tower(hf) if tower else {})}
        torch.save(saved, file)
    return dst


def write_dist_qwen_vl(hf, hf_folder, dst, tp=2) -> Path:
    """write_torch_dist's checkpoint with the keys under language_model. and the tower (replicated) beside."""
    state, config = _text(hf)
    dm = writer._dims(config)
    args = writer.megatron_args(config, tensor_model_parallel_size=tp, expert_tensor_parallel_size=tp,
                                ckpt_format="torch_dist", use_dist_ckpt=True, iteration=1, **_args(config, hf_folder))
    del args.model_type
    tensors = writer.dist_tensors(writer.megatron_global(state, config, args.padded_vocab_size), te_names=True)
    common = {"args": args, "checkpoint_version": writer.CHECKPOINT_VERSION, "iteration": 1,
              "num_floating_point_operations_so_far": 0, "content_metadata": dict(writer.CONTENT_METADATA)}
    ranks = []
    for t in range(tp):
        pieces = [(LM + key, offs, piece, tuple(x.shape)) for key, x in tensors.items()
                  for offs, piece in writer._tp_chunks(key, x, t, tp, dm["L"])]
        if t == 0:
            pieces += [(LM + key, None, writer._saved_bytes([None]), None) for key in writer._extra_state_keys(dm)]
            pieces += [(k, (0,) * v.dim(), v.clone(), tuple(v.shape)) for k, v in _tower(hf).items()]
        ranks.append(pieces)
    writer._write_tracker(dst, 1, False)
    it = dst / writer._iter_dir(1, False)
    it.mkdir(parents=True)
    writer.write_dcp(it, ranks)
    torch.save(common, it / "common.pt")
    (it / "metadata.json").write_text(json.dumps(writer.METADATA_JSON))
    return dst


def _model(root, preset):
    hf = pai_zoo.load(preset, backend="hf", seed=1)
    hf.model.save_pretrained(root / "hf")
    hf.family.test_tokenizer(root / "hf")
    return root, pai_zoo.load(root / "hf", backend="hf")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("mlm-qwen-vl"), "qwen3_vl-tiny")


@pytest.mark.parametrize("layout", ["legacy-tp1", "legacy-tp2", "dist-tp2", "moe-legacy-tp1"])
def test_qwen3_vl_checkpoint_is_read(model, layout, tmp_path):
    root, hf = model if not layout.startswith("moe") else _model(tmp_path, "qwen3_vl_moe-tiny")
    src = tmp_path / "mlm"
    if "legacy" in layout:
        write_legacy_qwen_vl(hf, root / "hf", src, tp=int(layout[-1]))
    else:
        write_dist_qwen_vl(hf, root / "hf", src)
    mc = pai_zoo.load(src, backend="mcore", tokenizer=root / "hf")
    assert mc.family.name == hf.family.name
    case = hf.family.vision.example(hf.mcore_config, torch.Generator().manual_seed(0))
    assert "pixel_values" in case and "pixel_values_videos" in case
    ids = case.pop("input_ids")
    want = hf.logits(ids, **case)
    assert (mc.logits(ids, **case) - want).abs().max().item() <= 1e-5 and want.abs().max().item() > 0.1
    if layout != "legacy-tp2":
        return
    out = tmp_path / "hf-out"
    proc = run_cli(["convert", src, out, "--to", "hf", "--tokenizer", root / "hf"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, theirs = load_file(out / "model.safetensors"), load_file(root / "hf" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_what_cannot_be_read_is_refused_in_one_line(model, tmp_path):
    root, hf = model
    qwen = write_legacy_qwen_vl(hf, "Qwen/Qwen3-VL-2B-Instruct", tmp_path / "qwen")  # no local folder named
    towerless = write_legacy_qwen_vl(hf, root / "hf", tmp_path / "towerless", tower=False)
    llava = write_legacy_qwen_vl(hf, root / "hf", tmp_path / "llava", kind="siglip", tower=False)
    for file in (llava / "iter_0000001").glob("mp_rank_*/model_optim_rng.pt"):
        saved = torch.load(file, weights_only=False)
        saved["model"].update({"vision_model.decoder.layers.0.mlp.linear_fc1.weight": torch.zeros(8, 4),
                               "vision_projection.encoder.linear_fc1.weight": torch.zeros(8, 4)})
        torch.save(saved, file)
    cases = [(qwen, [], ["keeps its tower's settings only in the Hugging Face model",
                         "args.hf_model_name='Qwen/Qwen3-VL-2B-Instruct'", "--tokenizer HF_DIR"]),
             (towerless, ["--tokenizer", root / "hf"], ["a Megatron-LM Qwen-VL checkpoint", "without its tower"]),
             (llava, [], ["a Megatron-LM LLaVA checkpoint (args.vision_model_type='siglip'",
                          "vision_model.*, vision_projection.*", "no Qwen-VL model"])]
    for src, extra, wanted in cases:
        for command in (["convert", src, tmp_path / "out", "--to", "hf", *extra], ["inspect", src, *extra]):
            proc = run_cli(command)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
            assert all(w in lines[0] for w in wanted), lines[0]
            assert not (tmp_path / "out").exists()


def test_the_refusal_names_what_is_missing():
    from pai_zoo.formats.megatron_lm_multimodal import multimodal_refusal

    assert multimodal_refusal("f", ["embedding.word_embeddings.weight"], {}) is None  # a GPT checkpoint
    assert multimodal_refusal("f", [LM + "embedding.word_embeddings.weight", TOWER + "merger.norm.weight"],
                              {"vision_model_type": "qwen3_vl"}) is None  # read
    line = multimodal_refusal("f", [LM + "embedding.word_embeddings.weight"], {})
    assert "without args.vision_model_type" in line and "\n" not in line
