"""``pai-zoo eval``: held-out loss against transformers' own loss and across backends and layouts, the same loss as
``train --eval-interval``, lm-eval tasks against ``lm_eval``'s own HF model, and bad input.

Models: llama-odd (6 query heads in 2 KV groups, GQA ratio 3, head_dim 16 != 72 / 6), qwen2-moe-odd (a mixture of
experts) and bloom-odd (ALiBi, vocabulary 997 padded by megatron-core), at vocabulary 300 with the toy tokenizer
(no BOS) or, for the lm-eval agreement, llama-odd at 1001 with the Llama test tokenizer (BOS).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo.data import toy
from pai_zoo.data.indexed import IndexedDatasetReader
from pai_zoo.data.preprocess import preprocess
from pai_zoo.families.registry import get_registry
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

TASKS = Path(__file__).parent / "eval_tasks"
REL = 1e-5  # the issue's tolerance for losses (fp32)


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _model(root: Path, preset: str, vocab: int = 300) -> Path:
    folder = root / preset
    pai_zoo.load(preset, backend="hf", seed=3, vocab_size=vocab).model.save_pretrained(folder)
    toy.write_tokenizer(folder, vocab_size=vocab)
    return folder


def _eval(model, *argv, output: Path) -> dict:
    _ok(run_cli(["eval", model, *argv, "--output", output, "--no-progress"]))
    return json.loads(output.read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    text = toy.write_corpus(root / "corpus.jsonl", documents=40)
    return root, text


def _data(corpus, folder: Path, name: str) -> Path:
    root, text = corpus
    preprocess([text], root / name, str(folder), append_eod=True, progress=False)
    return root / f"{name}_text_document"


@pytest.fixture(scope="module")
def llama(corpus):
    """llama-odd: its HF folder, its Megatron-Core checkpoint and the corpus tokenized with its tokenizer."""
    root, _ = corpus
    hf = _model(root, "llama-odd")
    _ok(run_cli(["convert", hf, root / "llama-mcore", "--to", "mcore"]))
    return hf, root / "llama-mcore", _data(corpus, hf, "llama-data")


def _transformers_loss(folder: Path, prefix: Path) -> tuple[float, int]:
    """transformers' own loss (``labels=``), one document per forward: summed loss over the targets, targets."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with IndexedDatasetReader(prefix) as reader, torch.no_grad():
        for j in range(reader.num_documents):
            ids = torch.as_tensor(reader.document(j).astype("int64"))[None]
            n = ids.shape[1] - 1
            total += model(input_ids=ids, labels=ids).loss.item() * n
            count += n
    return total / count, count


# -- the loss: transformers, megatron-core, both packings --------------------------------------------------------
@pytest.mark.parametrize("preset", ["llama-odd", "qwen2-moe-odd", "bloom-odd"])
def test_held_out_loss_equals_transformers_own_loss_in_both_backends(preset, corpus, tmp_path):
    """Per document (every document fits --seq-length 299): transformers' loss of each document, averaged over
    its targets, equals `eval --backend hf` and `eval` on the converted Megatron-Core checkpoint; with Megatron's
    packing the two backends agree too (dense, MoE and ALiBi families)."""
    hf = _model(tmp_path, preset)
    _ok(run_cli(["convert", hf, tmp_path / "mcore", "--to", "mcore"]))
    data = _data(corpus, hf, f"{preset}-data")
    want, targets = _transformers_loss(hf, data)
    for packing in ("document", "megatron"):
        common = ["--data", data, "--seq-length", "299" if packing == "document" else "96", "--packing", packing]
        ours_hf = _eval(hf, *common, "--backend", "hf", output=tmp_path / f"hf-{packing}.json")["data"][0]
        ours = _eval(tmp_path / "mcore", *common, output=tmp_path / f"mcore-{packing}.json")["data"][0]
        assert ours["loss"] == pytest.approx(ours_hf["loss"], rel=REL)
        assert ours["tokens"] == ours_hf["tokens"] and ours["perplexity"] == pytest.approx(ours_hf["perplexity"],
                                                                                           rel=REL)
        if packing == "document":
            assert ours["tokens"] == targets and ours["sequences"] == 40
            assert ours["loss"] == pytest.approx(want, rel=REL)
        else:  # 96-token samples across documents: every sample scores 96 tokens
            assert ours["tokens"] == 96 * ours["sequences"] and ours["sequences"] > 5
    assert 4.0 < want < 8.0  # a random model on 300 tokens: near log(300) = 5.7, not a degenerate 0


def test_blend_json_and_the_jsonl_form(llama, corpus, tmp_path):
    """Two datasets: the blend's loss is over all tokens, or the weighted mean of the datasets' losses; a JSON
    Lines file tokenized on the fly scores as its preprocessed prefix; --max-tokens caps each dataset."""
    _, mcore, data = llama
    _, text = corpus
    out = _eval(mcore, "--data", data, text, "--seq-length", "32", output=tmp_path / "a.json")
    a, b = out["data"]
    assert a["prefix"] == str(data) and b["prefix"] == str(text)
    assert a["loss"] == b["loss"] and a["tokens"] == b["tokens"]  # same tokens, same samples
    assert out["blend"]["tokens"] == 2 * a["tokens"] and out["blend"]["loss"] == pytest.approx(a["loss"], rel=1e-12)
    capped = _eval(mcore, "--data", data, "--seq-length", "32", "--max-tokens", "100", output=tmp_path / "b.json")
    assert capped["data"][0]["tokens"] == 100 and capped["data"][0]["sequences"] == 4  # 32 + 32 + 32 + 4
    other = _eval(mcore, "--data", data, "--seq-length", "32", "--max-tokens", "64", output=tmp_path / "c.json")
    weighted = _eval(mcore, "--data", "3", data, "1", str(data), "--seq-length", "32", "--max-tokens", "64",
                     output=tmp_path / "d.json")
    assert weighted["blend"]["weighting"] == "weights" and weighted["blend"]["weights"] == [0.75, 0.25]
    assert weighted["blend"]["loss"] == pytest.approx(other["data"][0]["loss"], rel=1e-12)
    assert set(out) == {"data", "blend", "settings"} and out["settings"]["packing"] == "megatron"


def test_a_lora_adapter_is_evaluated_as_peft_applies_it(llama, tmp_path):
    """`eval BASE --adapter PEFT_DIR`: megatron-core with pai-zoo's adapters gives the loss of transformers with PEFT's
    own PeftModel (`--backend hf`), and not the base's."""
    import peft
    from transformers import AutoModelForCausalLM

    hf, _, data = llama
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                              init_lora_weights=False)).save_pretrained(tmp_path / "adapter")
    common = ["--data", data, "--seq-length", "32", "--max-tokens", "256", "--adapter", tmp_path / "adapter"]
    ours = _eval(hf, *common, output=tmp_path / "ours.json")["data"][0]
    theirs = _eval(hf, *common, "--backend", "hf", output=tmp_path / "peft.json")["data"][0]
    plain = _eval(hf, *common[:-2], output=tmp_path / "plain.json")["data"][0]
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=REL) and ours["tokens"] == 256
    assert abs(ours["loss"] - plain["loss"]) > 1e-3


# -- layouts and training ---------------------------------------------------------------------------------------
@pytest.mark.megatron_once(first=True)  # eval's own sharding; megatron-core's TP/PP forward: the suite (both passes)
def test_tp2_pp2_and_dp2_equal_one_process(llama, tmp_path):
    """The held-out loss at TP=2 (from the HF folder, converted on the fly, and from the mcore checkpoint), PP=2 and
    DP=2 equals one process; lm-eval's loglikelihoods and greedy generations at TP=2 equal one process's."""
    hf, mcore, data = llama
    loss = ["--data", data, "--seq-length", "48"]
    tasks = ["--tasks", "paizoo_mc,paizoo_gen", "--include-path", _tasks(tmp_path), "--log-samples"]
    one = _eval(mcore, *loss, output=tmp_path / "one.json")
    one_tasks = _eval(mcore, *tasks, output=tmp_path / "one-tasks.json")
    for name, source, layout in (("tp2-hf", hf, ["--tp", "2"]), ("tp2", mcore, ["--tp", "2", *tasks]),
                                 ("pp2", mcore, ["--pp", "2"]), ("dp2", mcore, [])):
        _ok(run_cli_on_ranks(["eval", source, *loss, *layout, "--output", tmp_path / name, "--no-progress"],
                             timeout=600))
        got = json.loads((tmp_path / name).read_text())
        assert got["data"][0]["tokens"] == one["data"][0]["tokens"], name
        assert got["data"][0]["loss"] == pytest.approx(one["data"][0]["loss"], rel=REL), name
        if name == "tp2":
            assert _loglikelihoods(got, "paizoo_mc") == pytest.approx(_loglikelihoods(one_tasks, "paizoo_mc"),
                                                                      abs=1e-4)
            assert _generations(got) == _generations(one_tasks)
            assert got["results"]["paizoo_mc"]["acc,none"] == one_tasks["results"]["paizoo_mc"]["acc,none"]


def test_eval_equals_train_eval_interval(llama, tmp_path):
    """A run's validation loss at its first evaluation (3 global batches of 2 samples of 32 tokens of the validation
    part of --split 50,50,0) equals `eval` of the checkpoint saved at that step on that split's samples."""
    hf, _, data = llama
    run = tmp_path / "run"
    _ok(run_cli(["train", "--model", hf, "--data", data, "--save", run, "--split", "50,50,0", "--seq-length", "32",
                 "--global-batch-size", "2", "--batch-size", "1", "--train-iters", "2", "--eval-interval", "2",
                 "--eval-iters", "3", "--save-interval", "2", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup-iters",
                 "1", "--no-progress"]))
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    want = next(m["eval_loss"] for m in logged if "eval_loss" in m)
    got = _eval(run, "--data", data, "--split", "50,50,0", "--seq-length", "32", "--max-tokens", str(3 * 2 * 32),
                output=tmp_path / "e.json")["data"][0]
    assert got["tokens"] == 192 and got["loss"] == pytest.approx(want, rel=REL)
    base = _eval(hf, "--data", data, "--split", "50,50,0", "--seq-length", "32", "--max-tokens", "192",
                 output=tmp_path / "base.json")["data"][0]
    assert abs(base["loss"] - want) > 1e-3  # the trained weights are the ones evaluated


# -- lm-evaluation-harness ---------------------------------------------------------------------------------------
def _tasks(root: Path) -> Path:
    """The shipped task YAML files, their data paths made absolute."""
    out = root / "tasks"
    out.mkdir(exist_ok=True)
    for yaml in TASKS.glob("*.yaml"):
        (out / yaml.name).write_text(yaml.read_text().replace("tests/eval_tasks/", f"{TASKS}/"))
    return out


def _loglikelihoods(results: dict, task: str) -> list[float]:
    out = []
    for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"]):
        for resp in sample["resps"]:
            value = resp[0]
            out.append(float(value[0] if isinstance(value, (list, tuple)) else value))
    return out


def _generations(results: dict) -> list[str]:
    return [s["resps"][0][0] for s in sorted(results["samples"]["paizoo_gen"], key=lambda s: s["doc_id"])]


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    """llama-odd at vocabulary 1001 with the Llama test tokenizer (SentencePiece, BOS added) and its mcore form."""
    root = tmp_path_factory.mktemp("eval-bos")
    folder = root / "hf"
    pai_zoo.load("llama-odd", backend="hf", seed=3).model.save_pretrained(folder)
    get_registry().family("llama").test_tokenizer(folder)
    _ok(run_cli(["convert", folder, root / "mcore", "--to", "mcore"]))
    return folder, root / "mcore"


@pytest.mark.parametrize("tokenizer", ["bos", "no-bos"])
def test_tasks_agree_with_lm_evals_own_hf_model(tokenizer, bos_model, llama, tmp_path):
    """The offline tasks (multiple choice with one few-shot example, greedy generation, rolling perplexity in
    48-token windows) through lm-eval's own `simple_evaluate`: `pai-zoo eval` on the Megatron-Core checkpoint and
    lm-eval's HF model (`--model hf`) on the HF folder give the same accuracy, loglikelihoods within 1e-4 and the
    same generated text, with a BOS-adding tokenizer and with one that has no BOS (EOS is the empty context's)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    hf, mcore = bos_model if tokenizer == "bos" else llama[:2]
    tasks = _tasks(tmp_path)
    names = ["paizoo_mc", "paizoo_gen", "paizoo_rolling"]
    ours = _eval(mcore, "--tasks", ",".join(names), "--include-path", tasks, "--log-samples", "--max-length", "48",
                 "--num-fewshot", "1", output=tmp_path / "ours.json")
    theirs = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(hf), "dtype": "float32", "device": "cpu", "max_length": 48},
        tasks=names, num_fewshot=1, task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
        batch_size=4)
    theirs = json.loads(json.dumps({"results": theirs["results"], "samples": theirs["samples"]}, default=str))
    for task in ("paizoo_mc", "paizoo_rolling"):
        mine, want = _loglikelihoods(ours, task), _loglikelihoods(theirs, task)
        assert len(mine) == len(want) >= 3
        assert mine == pytest.approx(want, abs=1e-4)
    assert ours["results"]["paizoo_mc"]["acc,none"] == theirs["results"]["paizoo_mc"]["acc,none"]
    assert ours["results"]["paizoo_mc"]["acc_norm,none"] == theirs["results"]["paizoo_mc"]["acc_norm,none"]
    assert _generations(ours) == _generations(theirs) and any(_generations(ours))
    rolling = ours["results"]["paizoo_rolling"]["bits_per_byte,none"]
    assert rolling == pytest.approx(theirs["results"]["paizoo_rolling"]["bits_per_byte,none"], rel=1e-5)
    assert ours["settings"]["max_length"] == 48 and "n-shot" in ours


# -- bad input: one line, nothing written ------------------------------------------------------------------------
def _refused(argv, output: Path) -> str:
    proc = run_cli([*argv, "--output", output, "--no-progress"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("pai-zoo: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and not output.exists()
    return lines[0]


def test_bad_input_is_refused_in_one_line_with_nothing_written(llama, corpus, tmp_path):
    hf, mcore, data = llama
    root, text = corpus
    big = _model(tmp_path, "llama-odd", vocab=400)  # a tokenizer of 400 tokens: ids the 300-token model lacks
    preprocess([text], tmp_path / "big", str(big), append_eod=True, progress=False)
    out = tmp_path / "out.json"
    line = _refused(["eval", mcore, "--data", tmp_path / "big_text_document"], out)
    assert "outside the vocabulary [0, 300)" in line and "big_text_document" in line
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text(json.dumps({"text": "a b"}) + "\n")
    line = _refused(["eval", mcore, "--data", tiny, "--seq-length", "64"], out)
    assert "nothing to evaluate" in line and "--packing document" in line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "no documents" in _refused(["eval", mcore, "--data", empty], out)
    line = _refused(["eval", mcore, "--tasks", "paizoo_mcq", "--include-path", _tasks(tmp_path)], out)
    assert "--tasks paizoo_mcq" in line and "paizoo_mc" in line  # the nearest name
    positions = pai_zoo.load(mcore).mcore_config["max_sequence_length"]
    line = _refused(["eval", mcore, "--data", data, "--seq-length", str(positions + 1)], out)
    assert f"has {positions} positions" in line
    assert "give --data" in _refused(["eval", mcore], out)
    line = _refused(["eval", mcore, "--data", data, "--split", "99,0,1"], out)
    assert "VALID > 0" in line
    shutil.rmtree(tmp_path / "tasks")
