"""A tiny preset means one tokenizer everywhere (preprocess, load/generate, rl, train), its ids fit the preset's
vocabulary, and ``pai-zoo train`` refuses data whose token ids do not fit the model, before any step."""
from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import pai_zoo
from pai_zoo.cli import main as cli
from pai_zoo.data.indexed import sidecar_path
from pai_zoo.data.preprocess import output_prefix, preprocess
from pai_zoo.families.registry import get_registry
from pai_zoo.generation import generate
from pai_zoo.testing.tokenizers import SAMPLE_TEXT
from pai_zoo.tokenizers.names import NoBundledTokenizerError, family_tokenizer, resolve_tokenizer

TEXTS = ["Hello world, the quick brown fox.", "def forward(self, x):\n    return x + 12345", "你好，世界 🙂"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A fresh HOME, so the bundled tokenizers are written by the code under test, not found in a cache."""
    path = tmp_path_factory.mktemp("home")
    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(path))
    for name in ("PAI_ZOO_CACHE", "XDG_CACHE_HOME"):
        patch.delenv(name, raising=False)
    yield path
    patch.undo()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"{TEXTS[i % 3]} {SAMPLE_TEXT[i % len(SAMPLE_TEXT)]} {i}"}) + "\n")
    return path


def bin_ids(prefix) -> np.ndarray:
    """The tokens of a dataset, read with megatron-core's own reader."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    return np.concatenate([ds[i] for i in range(len(ds))])


def model_vocab(family, preset) -> int:
    """The vocabulary a preset's model has, as load and train translate its config."""
    from pai_zoo.hf import models as hf

    return family.to_mcore_config(hf.config_dict(hf.hf_config(family, get_registry().preset(preset)[1])))["vocab_size"]


# -- one tokenizer per name ------------------------------------------------------------------------
def test_every_families_test_presets_resolve_to_their_test_tokenizer_and_fit_its_vocabulary(home, tmp_path):
    registry = get_registry()
    checked = set()
    for family in registry.families.values():
        assert family.test_tokenizer is not None, f"{family.name} has no test tokenizer"
        assert family.tiny in family.test_presets
        written = tmp_path / family.name
        family.test_tokenizer(written)
        expected = family_tokenizer(family, written)
        for preset in family.test_presets:
            tokenizer = resolve_tokenizer(preset).load()
            vocab = model_vocab(family, preset)
            ids = [tokenizer.encode(text) for text in (*TEXTS, *SAMPLE_TEXT)]
            assert ids == [expected.encode(text) for text in (*TEXTS, *SAMPLE_TEXT)], preset  # Family.test_tokenizer
            assert tokenizer.vocab_size <= vocab, (preset, tokenizer.vocab_size, vocab)  # every id fits the model
            assert max(max(i) for i in ids) < vocab
            checked.add(family.name)
    assert checked == set(registry.families) and len(checked) >= 9


def test_load_of_a_tiny_preset_carries_the_same_tokenizer_as_preprocess(home, corpus, tmp_path):
    preprocess([corpus], tmp_path / "ds", "llama3-tiny", progress=False)
    data = bin_ids(output_prefix(tmp_path / "ds", "text"))
    handle = pai_zoo.load("llama3-tiny")
    assert handle.tokenizer is not None
    lines = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    assert np.concatenate([handle.tokenizer.encode(t) for t in lines]).tolist() == data.tolist()
    assert handle.tokenizer.vocab_size <= handle.vocab_size == 1000
    assert pai_zoo.load("llama").tokenizer is None  # a family name is not a test preset


def test_published_names_are_never_the_toy_tokenizer(home):
    # the real published tokenizer where the plugin bundles one for the preset, else a refusal (no toy, no warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_tokenizer("mistral-7b").load().vocab_size == 32000
        for name in ("qwen2", "llama3-8b", "llama"):
            with pytest.raises(NoBundledTokenizerError, match=f"--tokenizer {name}: .*bundles no published tokenizer"):
                resolve_tokenizer(name)
    qwen2 = get_registry().family("qwen2")
    assert resolve_tokenizer("qwen2-tiny").load().vocab_size <= model_vocab(qwen2, "qwen2-tiny")  # its toy still


def test_generate_decodes_a_tiny_presets_ids_past_its_toy_vocabulary(home):
    handle = pai_zoo.load("llama3-tiny")
    size = handle.tokenizer.vocab_size
    [out] = generate(handle, "Hello world", max_new_tokens=24, temperature=1.0, seed=0, eos_token_id=[])
    assert any(i >= size for i in out.token_ids)  # the model's padding rows past the tokenizer were sampled
    assert out.text == handle.tokenizer.decode([i for i in out.token_ids if i < size])


def test_rl_reward_on_a_tiny_preset_uses_the_tokenizer_preprocess_used(home, tmp_path, capsys):
    prompt, chosen, rejected = "Hello world,", " the quick brown fox.", " 12345 你好"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in (prompt, chosen, rejected)))
    preprocess([tmp_path / "in.jsonl"], tmp_path / "ds", "llama3-tiny", progress=False)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(output_prefix(tmp_path / "ds", "text")))
    want = [ds[i].tolist() for i in range(3)]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n"
                             for _ in range(4)))
    rc = cli(["rl", "reward", "--model", "llama3-tiny", "--data", str(pairs), "--save", str(tmp_path / "rm"),
              "--batch-size", "4", "--eval-fraction", "0"])
    assert rc == 0, capsys.readouterr().err
    from pai_zoo.rl.data import read_pairs

    reward = pai_zoo.load(tmp_path / "rm")  # the reward model carries the tokenizer it read its data with
    [pair] = read_pairs(pairs, reward.tokenizer, reward.vocab_size)[:1]
    assert pair.prompt == want[0]
    assert [reward.tokenizer.bos_id, *pair.chosen] == want[1] and [reward.tokenizer.bos_id, *pair.rejected] == want[2]


# -- the sidecar and merge -------------------------------------------------------------------------
def test_preprocess_writes_a_sidecar_that_merge_keeps_correct(home, corpus, tmp_path):
    preprocess([corpus], tmp_path / "small", "llama3-tiny", progress=False)
    preprocess([corpus], tmp_path / "big", "mistral-7b", progress=False)
    small, big = output_prefix(tmp_path / "small", "text"), output_prefix(tmp_path / "big", "text")
    record = json.loads(Path(sidecar_path(small)).read_text())
    assert record["max_token_id"] == int(bin_ids(small).max()) and record["tokenizer"]["name"] == "llama3-tiny"
    # Megatron-LM's tools/merge_datasets.py pairs each file of a folder, by its name without the last suffix,
    # with a .idx: the sidecar must pair with its own dataset.
    assert os.path.splitext(Path(sidecar_path(small)).name)[0] == Path(small).name
    largest = max(int(bin_ids(small).max()), int(bin_ids(big).max()))
    assert largest > 1000 > int(bin_ids(small).max())
    pai_zoo_cli(["dataset", "merge", small, big, "--output-prefix", str(tmp_path / "merged")])
    merged = json.loads(Path(sidecar_path(tmp_path / "merged")).read_text())
    assert merged["max_token_id"] == largest == int(bin_ids(tmp_path / "merged").max())
    assert "tokenizer" not in merged  # two tokenizers went in
    from pai_zoo.data.indexed import token_id_range

    ids = bin_ids(big)
    os.unlink(sidecar_path(big))
    assert token_id_range(big, chunk_size=7) == (int(ids.min()), int(ids.max()))  # the chunked pass over .bin
    for prefix in (small,):  # inputs without sidecars: merge reads their ids
        os.unlink(sidecar_path(prefix))
    pai_zoo_cli(["dataset", "merge", big, small, "--output-prefix", str(tmp_path / "merged2")])
    assert json.loads(Path(sidecar_path(tmp_path / "merged2")).read_text())["max_token_id"] == largest


def pai_zoo_cli(argv):
    assert cli(argv) == 0


# -- train checks the data before the first step ---------------------------------------------------
def train_cli(data, save, *extra):
    return ["train", "--model", "llama3-tiny", "--data", str(data), "--save", str(save), "--global-batch-size", "2",
            "--batch-size", "1", "--seq-length", "16", "--train-tokens", "64", "--warmup-tokens", "32",
            "--no-progress", *extra]


def test_train_refuses_data_from_a_bigger_tokenizer_with_or_without_the_sidecar(home, corpus, tmp_path, capsys):
    preprocess([corpus], tmp_path / "big", "mistral-7b", append_eod=True, progress=False)
    prefix = output_prefix(tmp_path / "big", "text")
    largest = int(bin_ids(prefix).max())
    assert largest >= 1000
    for sidecar in (True, False):
        if not sidecar:
            os.unlink(sidecar_path(prefix))
        code = cli(train_cli(prefix, tmp_path / "out"))
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("pai-zoo: error: ") and err.count("\n") == 1, err
        assert f"--data {prefix}:" in err and f"largest id {largest}," in err and "vocabulary size 1000" in err, err
        assert "different tokenizer" in err and "Traceback" not in err
        assert ("--tokenizer mistral-7b," in err) == sidecar  # the sidecar names the tokenizer the data was made with
        assert not (tmp_path / "out").exists()  # nothing trained or written
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"instruction": "Say hello", "output": "Hello world " * 20}) + "\n")
    from pai_zoo.data.preprocess import preprocess_sft

    preprocess_sft([sft], tmp_path / "sft", "mistral-7b", seq_length=64, progress=False)
    code = cli(train_cli(tmp_path / "sft", tmp_path / "out", "--sft"))
    err = capsys.readouterr().err
    assert code == 1 and f"--data {tmp_path / 'sft'}_text_document:" in err and "vocabulary size 1000" in err, err
    assert not (tmp_path / "out").exists()


def test_preprocess_then_train_a_tiny_preset_end_to_end(home, corpus, tmp_path, pai_zoo_cli_server):
    """Two commands as a shell runs them (through the session's command server), in a fresh HOME."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOME": str(home)}
    pz = [str(pai_zoo_cli_server.bin / "pai-zoo")]
    proc = subprocess.run([*pz, "preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "ds"),
                           "--tokenizer", "llama3-tiny", "--append-eod"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    prefix = output_prefix(tmp_path / "ds", "text")
    proc = subprocess.run([*pz, *train_cli(prefix, tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    # The checkpoint reads text with the tokenizer its data was made with.
    trained = pai_zoo.load(tmp_path / "out").tokenizer
    assert trained is not None and trained.encode(TEXTS[2]) == resolve_tokenizer("llama3-tiny").load().encode(TEXTS[2])
