"""LoRA on megatron-core, exchanged with Hugging Face PEFT both ways (the real ``peft`` loads and merges).

Models: llama-odd (6 query heads in 2 KV groups, GQA ratio 3, head_dim 16 != 72 / 6, vocabulary 1001), qwen2-odd
(q/k/v biases, head_dim 20) and qwen2-moe-odd (a mixture of experts whose shared expert is adapted; transformers
fuses the routed experts into one tensor, which PEFT's LoRA does not adapt).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo.families.registry import get_registry
from pai_zoo.formats.peft_adapter import read_peft_adapter
from pai_zoo.lora.targets import lora_targets, to_hf_form, to_mcore_form
from pai_zoo.tables.mapping import MappingContext
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

peft = pytest.importorskip("peft", reason="peft is a test dependency (pip install -e '.[test]')")

IDS = torch.tensor([[1, 5, 9, 77, 300, 2, 8, 41, 123, 7, 250, 19]])
TOY_IDS = IDS % 290  # the trained base's vocabulary is 300
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PRESETS = {"llama-odd": ALL, "qwen2-odd": ["q_proj", "v_proj", "down_proj", "up_proj"], "qwen2-moe-odd": ALL}


def _base(root: Path, preset: str, vocab: int | None = None) -> Path:
    from pai_zoo.data import toy

    folder = root / preset
    extra = {"vocab_size": vocab} if vocab else {}
    pai_zoo.load(preset, backend="hf", seed=3, **extra).model.save_pretrained(folder)
    if vocab:
        toy.write_tokenizer(folder, vocab_size=vocab)
    return folder


def _peft_model(base: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()


def _random_adapter(base: Path, out: Path, targets, seed: int = 0, **config) -> None:
    """A PEFT adapter with random A and B (``init_lora_weights=False``), saved by PEFT itself."""
    torch.manual_seed(seed)
    model = peft.get_peft_model(_peft_model(base), peft.LoraConfig(
        r=4, lora_alpha=12, target_modules=targets, init_lora_weights=False, **config))
    model.save_pretrained(out)


@pytest.fixture(scope="module", params=list(PRESETS))
def imported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = _base(root, request.param)
    _random_adapter(base, root / "adapter", PRESETS[request.param], use_rslora=request.param == "qwen2-odd")
    return request.param, base, root / "adapter"


def test_an_hf_peft_adapter_applies_as_peft_applies_it(imported):
    """PEFT's logits (the real library on the transformers model) equal pai-zoo's LoRA megatron-core model's; the
    adapter moves them far more than the tolerance, so a misplaced row would show."""
    _, base, adapter = imported
    peft_model = peft.PeftModel.from_pretrained(_peft_model(base), adapter).eval()
    with torch.no_grad():
        want = peft_model(IDS).logits
    got = pai_zoo.load(base, backend="mcore", adapter=adapter).logits(IDS)
    without = pai_zoo.load(base, backend="mcore").logits(IDS)
    assert (got - want).abs().max().item() <= 1e-4
    assert (without - want).abs().max().item() > 1e-2
    hf_got = pai_zoo.load(base, backend="hf", adapter=adapter).logits(IDS)  # the hf backend: PEFT itself
    assert (hf_got - want).abs().max().item() <= 1e-6


def test_the_imported_adapter_is_exact(imported):
    """HF form -> mcore form (B's rows placed by the fused weight's row) -> HF form gives PEFT's tensors back bit
    for bit, and the mcore form of q/k/v is what the QKV row makes of them."""
    name, base, adapter = imported
    settings, hf = read_peft_adapter(adapter)
    handle = pai_zoo.load(base, backend="mcore")
    family, config = handle.family, handle.mcore_config
    targets = lora_targets(get_registry().weight_map(family, config))
    ctx = MappingContext.from_config(config)
    mcore = to_mcore_form(hf, targets, config, ctx)
    back = to_hf_form(mcore, targets, config, ctx)
    assert set(back) == set(hf)
    for module, (a, b) in hf.items():
        assert torch.equal(back[module][0], a) and torch.equal(back[module][1], b), module
    # the q adapter's B in mcore form: its rows in the order the fused linear_qkv holds query rows (per group)
    q = hf["model.layers.0.self_attn.q_proj"][1]
    assert torch.equal(mcore["decoder.layers.0.self_attention.linear_qkv.lora_adapters.q_proj.lora_B"], q)
    assert settings.rank == 4 and settings.alpha == 12


# -- training ------------------------------------------------------------------------------------------------------
STEPS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("lora-train")
    base = _base(root, "llama-odd", vocab=300)
    text = toy.write_corpus(root / "corpus.jsonl", documents=60)
    preprocess([text], root / "toy", str(base), append_eod=True, progress=False)
    return root, base, root / "toy_text_document"


def _train_argv(base, data, save, *extra):
    return ["train", "--model", base, "--data", data, "--save", save, "--global-batch-size", "4", "--batch-size",
            "1", "--seq-length", "32", "--train-iters", str(STEPS), "--warmup-iters", "1", "--lr", "1e-2",
            "--min-lr", "1e-3", "--save-interval", "2", "--no-progress", "--peft", "lora", "--lora-rank", "4",
            "--lora-alpha", "8", "--seed", "5", *extra]


def _train(corpus, save, *extra, world=1):
    _, base, data = corpus
    argv = _train_argv(base, data, save, *extra)
    proc = run_cli_on_ranks(argv, timeout=600) if world == 2 else run_cli(argv)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(corpus):
    root = corpus[0]
    proc, losses = _train(corpus, root / "run")
    return root / "run", proc, losses


def test_lora_training_trains_the_adapters_only(trained, corpus):
    run, proc, losses = trained
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LoRA: "))
    assert re.search(r"rank 4, alpha 8.*trainable ([\d,]+) of ([\d,]+) parameters", line), line
    # llama-odd at vocabulary 300: per layer q 96 rows, k and v 32, o 72, gate and up 100, down 72 (rank 4 each)
    per_layer = 4 * ((72 + 96) + 2 * (72 + 32) + (96 + 72) + 2 * (72 + 100) + (100 + 72))
    assert f"trainable {2 * per_layer:,} of" in line, line
    assert len(losses) == STEPS and losses[-1] < losses[0]
    record = json.loads((run / "lora.json").read_text())
    assert record["base"]["path"] == str(corpus[1].resolve()) and len(record["base"]["sha256"]) == 64
    from pai_zoo.formats.mcore_dist import DistCheckpointReader

    reader = DistCheckpointReader(run / f"iter_{STEPS:07d}")
    model_keys = [k for k in reader.keys() if k.startswith("decoder.") or k.startswith("embedding.")]
    reader.close()
    assert model_keys and all(".lora_adapters." in k for k in model_keys)  # no base tensor in the checkpoint


def test_the_frozen_base_is_bit_identical_after_training_steps(corpus, tmp_path):
    """In the trainer itself: after optimizer steps every base tensor is bit-identical, the adapters moved, and
    the optimizer holds the adapters only."""
    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.trainer import Trainer

    _, base, data = corpus
    cfg = TrainConfig.load(None, dict(
        model=str(base), data=[str(data)], save=str(tmp_path / "run"), global_batch_size=4, batch_size=1,
        sequence_length=32, train_iters=STEPS, warmup_iters=1, learning_rate=1e-2, min_learning_rate=1e-3,
        progress=False, peft="lora", lora_rank=4, lora_alpha=8, seed=5))
    trainer = Trainer(cfg, echo=lambda *a: None)
    trainer.setup()
    model = trainer.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert frozen and adapters and all(".lora_adapters." in n for n in adapters)
    for ddp in trainer.ddps:
        ddp.train()
    for step in range(2):
        trainer.train_step(step)
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n].detach(), t) for n, t in frozen.items())
    assert any(not torch.equal(now[n].detach(), t) for n, t in adapters.items())
    held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert len(held) == len(adapters)


def test_the_run_exports_to_peft_and_merges_as_peft_merges(trained, corpus, tmp_path):
    """convert --to hf-peft: PEFT loads it with no missing or unexpected adapter key and its logits equal pai-zoo's
    LoRA model's; convert --to hf --merge-lora equals PEFT's merge_and_unload."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    run, _, _ = trained
    base = corpus[1]
    proc = run_cli(["convert", run, tmp_path / "peft", "--to", "hf-peft"])
    assert proc.returncode == 0, proc.stderr
    peft_model = peft.PeftModel.from_pretrained(_peft_model(base), tmp_path / "peft").eval()
    stored = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    expected = get_peft_model_state_dict(peft_model)
    assert set(stored) == set(expected)
    assert not set_peft_model_state_dict(peft_model, stored).unexpected_keys
    with torch.no_grad():
        want = peft_model(TOY_IDS).logits
        plain = _peft_model(base)(TOY_IDS).logits
    got = pai_zoo.load(base, backend="mcore", adapter=run).logits(TOY_IDS)
    assert (got - want).abs().max().item() <= 1e-4
    assert (plain - want).abs().max().item() > 1e-3  # training moved the adapters off zero
    proc = run_cli(["convert", run, tmp_path / "merged", "--to", "hf", "--merge-lora"])
    assert proc.returncode == 0, proc.stderr
    merged = _peft_model(tmp_path / "merged").state_dict()
    reference = peft_model.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert max((merged[k] - reference[k]).abs().max().item() for k in reference) <= 1e-5


def test_tp2_tp2_sp_pp2_and_dp2_distopt_train_as_one_process(trained, corpus, tmp_path):
    """TP 2, TP 2 with sequence parallelism, PP 2 and DP 2 with the distributed optimizer: the same seed gives the
    same adapters at any layout (A drawn on the full shape), the loss curves match,
    and the adapters each layout exports (through the checkpoint, merged at TP 2 too) equal one process's."""
    run, _, losses = trained
    from pai_zoo.conversion.lora_export import hf_adapters_of_run

    _, reference, _ = hf_adapters_of_run(run)
    for layout in (["--tp", "2"], ["--tp", "2", "--sequence-parallel"], ["--pp", "2"],
                   ["--use-distributed-optimizer"]):
        save = tmp_path / "-".join(x.strip("-") for x in layout)
        _, got = _train(corpus, save, *layout, world=2)
        assert max(abs(a - b) for a, b in zip(got, losses)) <= 1e-5, (layout, got, losses)
        _, adapters, _ = hf_adapters_of_run(save)
        assert set(adapters) == set(reference)
        for module, (a, b) in reference.items():
            assert (adapters[module][0] - a).abs().max().item() <= 1e-5, (layout, module)
            assert (adapters[module][1] - b).abs().max().item() <= 1e-5, (layout, module)
    for name, source in (("merged-tp2", tmp_path / "tp-2"), ("merged-one", run)):  # merging a TP 2 run
        proc = run_cli(["convert", source, tmp_path / name, "--to", "hf", "--merge-lora"])
        assert proc.returncode == 0, proc.stderr
    tp2, one = _peft_model(tmp_path / "merged-tp2").state_dict(), _peft_model(tmp_path / "merged-one").state_dict()
    assert max((tp2[k] - one[k]).abs().max().item() for k in one) <= 1e-5


def test_a_lora_run_resumes_exactly_from_its_checkpoint(trained, corpus, tmp_path):
    """The uninterrupted run as a run stopped after step 2 leaves it (its step-2 checkpoint; the last checkpoint
    and log lines left out) resumes from step 2 (the base read again from its folder and checked, the adapters,
    their optimizer state and the RNG from the checkpoint) and repeats the uninterrupted run's losses. A run
    SIGKILLed while it publishes a checkpoint resumes in tests/test_train.py (every pass)."""
    import shutil

    run, _, losses = trained
    save = tmp_path / "run"
    shutil.copytree(run, save, ignore=shutil.ignore_patterns(f"iter_{STEPS:07d}"))
    (save / "latest_checkpointed_iteration.txt").write_text("2")
    lines = (save / "metrics.jsonl").read_text().splitlines(keepends=True)
    (save / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x).get("step", 0) <= 2))
    assert len((save / "metrics.jsonl").read_text().splitlines()) == 2
    proc, resumed = _train(corpus, save)
    assert "resuming" in proc.stdout
    assert resumed == losses and len(resumed) == STEPS


def test_peft_init_starts_from_the_adapter(corpus, tmp_path):
    """train --peft-init: the PEFT folder's adapters are the start (its rank and alpha); with a learning rate of
    0 they come out unchanged, so the model before the first step is PEFT's."""
    _, base, data = corpus
    _random_adapter(base, tmp_path / "init", ALL, seed=1)
    argv = ["train", "--model", base, "--data", data, "--save", tmp_path / "run", "--global-batch-size", "4",
            "--batch-size", "1", "--seq-length", "32", "--train-iters", "1", "--lr", "0", "--min-lr", "0",
            "--weight-decay", "0", "--no-progress", "--peft", "lora", "--peft-init", tmp_path / "init"]
    proc = run_cli(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 4, alpha 12" in proc.stdout
    peft_model = peft.PeftModel.from_pretrained(_peft_model(base), tmp_path / "init").eval()
    with torch.no_grad():
        want = peft_model(TOY_IDS).logits
    got = pai_zoo.load(base, backend="mcore", adapter=tmp_path / "run").logits(TOY_IDS)
    assert (got - want).abs().max().item() <= 1e-4


def test_lora_on_sft_data_learns_from_the_assistant_tokens_only(corpus, tmp_path):
    """--peft lora with --sft data: the loss falls and the targets are the assistant tokens (the loss mask)."""
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess_sft

    _, base, _ = corpus
    records = tmp_path / "chat.jsonl"
    with open(records, "w") as f:
        for i, sentence in enumerate(toy.sentences(40, seed=5)):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"say {i % 7}"},
                                             {"role": "assistant", "content": sentence}]}) + "\n")
    preprocess_sft([records], tmp_path / "chat", str(base), seq_length=64, progress=False)
    proc = run_cli(["train", "--model", base, "--data", tmp_path / "chat", "--save", tmp_path / "run", "--sft",
                    "--global-batch-size", "2", "--seq-length", "64", "--train-iters", "6", "--warmup-iters", "0",
                    "--lr", "1e-2", "--save-interval", "100", "--no-progress", "--peft", "lora"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == 6 and logged[-1]["loss"] < logged[0]["loss"]
    assert all(0 < r["target_tokens"] < 2 * 64 * 0.8 for r in logged)


def test_a_bias_family_trains_and_exports_as_peft_reads_it(tmp_path):
    """qwen2-odd (q/k/v biases, head_dim 20): a few LoRA steps, then PEFT's logits equal pai-zoo's."""
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    base = _base(tmp_path, "qwen2-odd", vocab=300)
    text = toy.write_corpus(tmp_path / "corpus.jsonl", documents=40)
    preprocess([text], tmp_path / "toy", str(base), append_eod=True, progress=False)
    _train((tmp_path, base, tmp_path / "toy_text_document"), tmp_path / "run", "--lora-target-modules",
           "q_proj,k_proj,v_proj,down_proj")
    assert run_cli(["convert", tmp_path / "run", tmp_path / "peft", "--to", "hf-peft"]).returncode == 0
    peft_model = peft.PeftModel.from_pretrained(_peft_model(base), tmp_path / "peft").eval()
    with torch.no_grad():
        want = peft_model(TOY_IDS).logits
        plain = _peft_model(base)(TOY_IDS).logits
    got = pai_zoo.load(base, backend="mcore", adapter=tmp_path / "run").logits(TOY_IDS)
    assert (got - want).abs().max().item() <= 1e-4 and (plain - want).abs().max().item() > 1e-3
    assert json.loads((tmp_path / "peft" / "adapter_config.json").read_text())["target_modules"] == [
        "down_proj", "k_proj", "q_proj", "v_proj"]


def test_generate_with_an_adapter_is_the_adapted_models_greedy_output(trained, corpus, tmp_path):
    run, _, _ = trained
    base = corpus[1]
    with_adapter = run_cli(["generate", "--model", base, "--adapter", run, "--prompt", "hello world",
                            "--max-new-tokens", "6"])
    assert with_adapter.returncode == 0, with_adapter.stderr
    run_cli(["convert", run, tmp_path / "merged", "--to", "hf", "--merge-lora"])
    merged = run_cli(["generate", "--model", tmp_path / "merged", "--prompt", "hello world", "--max-new-tokens", "6"])
    plain = run_cli(["generate", "--model", base, "--prompt", "hello world", "--max-new-tokens", "6"])
    assert merged.returncode == 0 and with_adapter.stdout == merged.stdout
    assert plain.returncode == 0 and plain.stdout != with_adapter.stdout  # the adapter changes the greedy tokens


# -- bad input -----------------------------------------------------------------------------------------------------
def _one_line(proc, pattern):
    assert proc.returncode != 0, proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("hint: ")]
    assert len(lines) == 1 and lines[0].startswith("pai-zoo: error: ") and re.search(pattern, lines[0]), lines


def test_a_lora_run_resumed_on_another_base_is_refused(trained, corpus, tmp_path):
    run, _, _ = trained
    _, base, data = corpus
    other = tmp_path / "other"
    shutil.copytree(base, other)
    file = other / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(file)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    save_file(tensors, file, metadata={"format": "pt"})
    save = tmp_path / "run"
    shutil.copytree(run, save)
    before = sorted(str(p) for p in save.rglob("*"))
    _one_line(run_cli(_train_argv(other, data, save)), r"adapts the base at .* holds other weights")
    assert sorted(str(p) for p in save.rglob("*")) == before
    _one_line(run_cli(["generate", "--model", other, "--adapter", save, "--prompt", "x"]), r"holds other weights")
    record = json.loads((save / "lora.json").read_text())  # a base that is gone: the merge names it
    record["base"]["path"] = str(tmp_path / "gone")
    (save / "lora.json").write_text(json.dumps(record))
    _one_line(run_cli(["convert", save, tmp_path / "merged", "--to", "hf", "--merge-lora"]), r"gone is missing")
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".merged*"))


@pytest.mark.parametrize("flags, pattern", [
    (["--lora-rank", "0"], r"--lora-rank 0: lora rank 0: must be a positive integer"),
    (["--lora-target-modules", "q_proj,wq"], r"\['wq'\]: family 'llama' has no such linear"),
    (["--peft", "ia3"], r"--peft ia3: unknown method"),
])
def test_bad_lora_settings_are_one_line_and_nothing_is_written(corpus, tmp_path, flags, pattern):
    _, base, data = corpus
    argv = _train_argv(base, data, tmp_path / "run")
    if flags[0] == "--peft":
        argv = argv[:argv.index("--peft")] + flags + argv[argv.index("--peft") + 2:]
    else:
        argv += flags
    _one_line(run_cli(argv), pattern)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case, pattern", [
    ("dora", r"use_dora = True is not supported"),
    ("modules_to_save", r"modules_to_save = \['lm_head'\] is not supported"),
    ("other architecture", r"the model has no such adaptable projection|lora_B has \d+ rows"),
])
def test_unusable_peft_adapters_are_one_line(corpus, tmp_path, case, pattern):
    _, base, _ = corpus
    if case == "other architecture":
        other = _base(tmp_path, "qwen2-odd")
        _random_adapter(other, tmp_path / "adapter", ALL)
    else:
        extra = {"use_dora": True} if case == "dora" else {"modules_to_save": ["lm_head"]}
        _random_adapter(base, tmp_path / "adapter", ["q_proj"], **extra)
    _one_line(run_cli(["generate", "--model", base, "--adapter", tmp_path / "adapter", "--prompt", "x"]), pattern)


def test_train_plan_counts_the_adapters_as_the_run_does(trained, corpus):
    """--plan with --peft lora: the trainable parameters are those the run reports, and gradients and Adam state
    shrink to theirs (the weights stay the base's plus the adapters')."""
    _, proc, _ = trained
    trainable = int(re.search(r"trainable ([\d,]+) of", proc.stdout).group(1).replace(",", ""))
    _, base, data = corpus
    argv = _train_argv(base, data, corpus[0] / "plan-only")
    lora = run_cli([*argv, "--plan"])
    full = run_cli([*argv[:argv.index("--peft")], *argv[argv.index("--seed"):], "--plan"])
    assert lora.returncode == 0 and full.returncode == 0, lora.stderr + full.stderr
    assert f"LoRA: {trainable:,} of them trainable" in lora.stdout, lora.stdout

    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.plan import make_plan

    config = pai_zoo.load(base, backend="mcore").mcore_config
    settings = dict(model=str(base), data=[str(data)], save="x", global_batch_size=4, batch_size=1,
                    sequence_length=32, train_iters=STEPS)
    with_lora = make_plan(config, TrainConfig.load(None, {**settings, "peft": "lora", "lora_rank": 4}), 1)
    without = make_plan(config, TrainConfig.load(None, settings), 1)
    assert with_lora.trainable_per_rank == trainable and without.trainable_per_rank is None
    assert with_lora.gradients == 4 * trainable and with_lora.optimizer == 8 * trainable
    assert with_lora.parameters == without.parameters + 4 * trainable
    assert with_lora.activations == without.activations
    assert not (corpus[0] / "plan-only").exists()
