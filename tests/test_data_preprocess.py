"""pai-zoo preprocess: text -> Megatron indexed datasets, read back with megatron-core's own reader."""
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pai_zoo.data.indexed import IndexedDatasetReader
from pai_zoo.data.preprocess import ordered_parallel_map, output_prefix, preprocess
from pai_zoo.data.sources import BadRecord
from pai_zoo.plugin.errors import PaiZooError
from pai_zoo.tokenizers import load_tokenizer

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

PAI_ZOO = str(Path(sys.executable).parent / "pai-zoo")
WORDS = "the of and to in is was for on that with as by at from his an were are which this be or has".split()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer trained here, with BOS added by its post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = tmp_path_factory.mktemp("bpe")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(20)) + " 你好，世界 🙂" for i in range(300)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    )
    return folder


def documents(n=40):
    return [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(5 + i % 17)) + (" 你好" if i % 5 == 0 else "")
            for i in range(n)]


def write_jsonl(path: Path, docs, key="text", opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d, "id": 1}) + "\n")
    return path


def megatron_read(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    return [ds[i].tolist() for i in range(len(ds))], ds.document_indices.tolist()


@pytest.mark.megatron
def test_jsonl_gz_zst_and_text_read_back_by_megatron(tmp_path, bpe):
    import zstandard

    docs = documents()
    write_jsonl(tmp_path / "a.jsonl", docs[:10])
    write_jsonl(tmp_path / "b.jsonl.gz", docs[10:20], opener=gzip.open)
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": d}) + "\n" for d in docs[20:30]).encode()))
    (tmp_path / "d.txt").write_text("\n\n".join(docs[30:35]) + "\n")
    summary = preprocess([tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.zst", tmp_path / "d.txt"],
                         tmp_path / "out", bpe, append_eod=True, text_mode="paragraph")
    tok = load_tokenizer(bpe)
    expected = [tok.encode(d) + [tok.eod_id] for d in docs[:35]]
    got, doc_index = megatron_read(output_prefix(tmp_path / "out", "text"))
    assert got == expected and doc_index == list(range(36))
    assert summary.documents == 35 and summary.tokens == sum(map(len, expected))
    assert IndexedDatasetReader(output_prefix(tmp_path / "out", "text")).dtype == "uint16"


def test_output_is_identical_whatever_the_number_of_workers(tmp_path, bpe):
    write_jsonl(tmp_path / "in.jsonl", documents(500))
    preprocess([tmp_path / "in.jsonl"], tmp_path / "one", bpe, workers=1, batch_size=16)
    preprocess([tmp_path / "in.jsonl"], tmp_path / "two", bpe, workers=2, batch_size=16)
    for suffix in (".bin", ".idx"):
        one = Path(output_prefix(tmp_path / "one", "text") + suffix).read_bytes()
        assert one == Path(output_prefix(tmp_path / "two", "text") + suffix).read_bytes()


@pytest.mark.megatron
def test_several_json_keys_and_globs(tmp_path, bpe):
    for i in range(3):
        with open(tmp_path / f"part{i}.jsonl", "w") as f:
            for d in documents(5):
                f.write(json.dumps({"text": f"{i} {d}", "title": d[:10]}) + "\n")
    preprocess([str(tmp_path / "part*.jsonl")], tmp_path / "out", bpe, json_keys=("text", "title"))
    tok = load_tokenizer(bpe)
    texts, _ = megatron_read(output_prefix(tmp_path / "out", "text"))
    titles, _ = megatron_read(output_prefix(tmp_path / "out", "title"))
    assert texts == [tok.encode(f"{i} {d}") for i in range(3) for d in documents(5)]
    assert titles == [tok.encode(d[:10]) for _ in range(3) for d in documents(5)]


@pytest.mark.megatron
def test_large_vocabulary_uses_int32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "w1 w69999 w65535 nope"}) + "\n")
    preprocess([tmp_path / "in.jsonl"], tmp_path / "out", tmp_path / "tokenizer.json")
    got, _ = megatron_read(output_prefix(tmp_path / "out", "text"))
    assert got == [[1, 69999, 65535, 70000]]
    assert IndexedDatasetReader(output_prefix(tmp_path / "out", "text")).dtype == "int32"


BAD_LINES = {
    "malformed": ('{"text": "ok"', r"bad.jsonl:3: malformed JSON"),
    "missing key": ('{"body": "x"}', r"bad.jsonl:3: no key 'text'"),
    "empty": ('{"text": "   "}', r"bad.jsonl:3: empty document"),
    "not utf-8": (b'{"text": "caf\xe9"}', r"bad.jsonl:3: not UTF-8"),
    "not a string": ('{"text": 5}', r"bad.jsonl:3: 'text' is a int, not a string"),
    "not an object": ('["text"]', r"bad.jsonl:3: expected a JSON object, found list"),
}


def write_bad(path: Path, line) -> Path:
    good = [json.dumps({"text": d}).encode() for d in documents(4)]
    raw = line if isinstance(line, bytes) else line.encode()
    path.write_bytes(b"\n".join(good[:2] + [raw] + good[2:]) + b"\n")
    return path


def outputs_present(prefix: Path) -> list[str]:
    return sorted(p.name for p in prefix.parent.iterdir() if p.name.startswith(prefix.name))


@pytest.mark.parametrize("engine", ["hf", "fast"])
@pytest.mark.parametrize("case", BAD_LINES)
def test_bad_record_stops_with_file_and_line_and_writes_nothing(tmp_path, bpe, case, engine):
    line, message = BAD_LINES[case]
    src = write_bad(tmp_path / "bad.jsonl", line)
    with pytest.raises(BadRecord, match=message):
        preprocess([src], tmp_path / "out", bpe, workers=2 if case == "empty" else 1, engine=engine)
    assert outputs_present(tmp_path / "out") == []


@pytest.mark.megatron
def test_skip_bad_counts_and_skips(tmp_path, bpe):
    src = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}).encode() for d in documents(6)]
    lines[1], lines[3], lines[5] = b'{"text": ', b'{"text": "caf\xe9"}', b'{"other": 1}'
    src.write_bytes(b"\n".join(lines) + b"\n")
    summary = preprocess([src], tmp_path / "out", bpe, skip_bad=True)
    assert summary.skipped == 3 and summary.documents == 3
    assert [e.split(":")[1] for e in summary.skipped_examples] == ["2", "4", "6"]
    got, _ = megatron_read(output_prefix(tmp_path / "out", "text"))
    tok = load_tokenizer(bpe)
    assert got == [tok.encode(d) for i, d in enumerate(documents(6)) if i in (0, 2, 4)]


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_interrupted_run_leaves_no_dataset(tmp_path, bpe, monkeypatch, engine):
    from pai_zoo.data import indexed

    write_jsonl(tmp_path / "in.jsonl", documents(50))
    calls = []
    original = indexed.IndexedDatasetWriter.add_documents

    def interrupt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(indexed.IndexedDatasetWriter, "add_documents", interrupt)
    with pytest.raises(KeyboardInterrupt):
        preprocess([tmp_path / "in.jsonl"], tmp_path / "out", bpe, batch_size=8, batch_bytes=400, engine=engine)
    assert len(calls) == 3 and outputs_present(tmp_path / "out") == []


def test_missing_inputs_are_errors(tmp_path, bpe):
    with pytest.raises(PaiZooError, match="no such file or folder: .*nope.jsonl"):
        preprocess([tmp_path / "nope.jsonl"], tmp_path / "out", bpe)
    with pytest.raises(PaiZooError, match="no file matches"):
        preprocess([str(tmp_path / "*.jsonl")], tmp_path / "out", bpe)
    with pytest.raises(PaiZooError, match="--tokenizer gpt-17: not a file, a folder, a family or a preset"):
        preprocess([tmp_path], tmp_path / "out", "gpt-17")


def test_ordered_parallel_map_keeps_order_and_bounds_what_is_in_flight():
    import operator

    consumed = []

    def batches():
        for i in range(40):
            consumed.append(i)
            yield [i, i + 1000]

    for k, result in enumerate(ordered_parallel_map(operator.add, [-1], batches(), 2)):
        assert result == [-1, k, k + 1000]  # fn(task, batch) = [-1] + batch, in input order
        assert len(consumed) <= k + 1 + 2 * 2  # never more than 2 x workers batches ahead


def test_a_worker_that_cannot_load_the_tokenizer_fails_the_run(tmp_path, bpe):
    from pai_zoo.data import preprocess as module

    write_jsonl(tmp_path / "in.jsonl", documents(10))
    broken = tmp_path / "broken"
    shutil.copytree(bpe, broken)
    real = module.resolve_tokenizer(broken)
    (broken / "tokenizer.json").write_text("{ not json")  # readable when resolved, broken when workers load it
    with pytest.raises(ValueError, match="tokenizer.json"):
        list(module.ordered_parallel_map(module._encode_pretraining, module._Task(("text",), True, False, "uint16"),
                                         [[("x:1", {"text": "a"})]], 2, module._init_worker, real))


@pytest.mark.megatron
def test_family_tokenizer_and_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    src = write_jsonl(tmp_path / "in.jsonl", ["Hello world", "你好，世界 🙂", "The end."])
    env = {**__import__("os").environ, "HOME": str(tmp_path / "home")}
    proc = subprocess.run([PAI_ZOO, "preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "ds"),
                           "--tokenizer", "mistral-7b", "--append-eod", "--workers", "2"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "3 documents" in proc.stdout and "ds_text_document" in proc.stdout
    prefix = output_prefix(tmp_path / "ds", "text")
    got, _ = megatron_read(prefix)
    [written] = (tmp_path / "home" / ".cache" / "pai-zoo" / "tokenizers").glob("llama-*")  # the bundled one
    llama = load_tokenizer(written)
    assert got[1] == llama.encode("你好，世界 🙂") + [llama.eod_id] and got[1][0] == llama.bos_id
    proc = subprocess.run([PAI_ZOO, "dataset", "inspect", prefix, "--document", "1", "--tokenizer", "mistral-7b"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "你好，世界 🙂" in proc.stdout and "documents:" in proc.stdout, proc.stderr
    proc = subprocess.run([PAI_ZOO, "dataset", "merge", prefix, prefix, "--output-prefix", str(tmp_path / "merged")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "6 documents" in proc.stdout, proc.stderr
    merged, _ = megatron_read(str(tmp_path / "merged"))
    assert merged == got + got
    proc = subprocess.run(
        [PAI_ZOO, "dataset", "inspect", prefix, "--document", "9"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1 and "document 9 is out of range" in proc.stderr
    proc = subprocess.run([PAI_ZOO, "preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "qwen"),
                           "--tokenizer", "qwen2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "--tokenizer qwen2: family 'qwen2' bundles no published tokenizer; pass the checkpoint's folder" \
        in proc.stderr
    assert not list(tmp_path.glob("qwen*"))  # nothing written, no toy tokenizer used


SFT_RECORDS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]},
    {"instruction": "Translate to French", "input": "cat", "output": "chat"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},
                  {"role": "assistant", "content": "Goodbye."}]},
] * 7


@pytest.mark.megatron
def test_sft_packs_tokens_and_loss_mask_with_record_boundaries(tmp_path, bpe):
    from pai_zoo.data import sft
    from pai_zoo.data.preprocess import preprocess_sft

    src = tmp_path / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in SFT_RECORDS))
    summary = preprocess_sft([src], tmp_path / "sft", bpe, seq_length=256, workers=2, batch_size=4)
    tok = load_tokenizer(bpe)
    examples = [sft.build_example(sft.normalize_record(r, "x"), tok) for r in SFT_RECORDS]
    tokens, token_docs = megatron_read(output_prefix(tmp_path / "sft", "text"))
    masks, mask_docs = megatron_read(output_prefix(tmp_path / "sft", "loss_mask"))
    assert token_docs == mask_docs and [len(t) for t in tokens] == [len(m) for m in masks]
    # every pack is 256 tokens; its sequences are the records in order, then padding
    for start, stop in zip(token_docs, token_docs[1:]):
        assert sum(len(tokens[i]) for i in range(start, stop)) == 256
    records = [
        (t, m)
        for t, m in zip(tokens, masks)
        if any(m) or t != [tok.pad_id if tok.pad_id is not None else tok.eod_id] * len(t)
    ]
    assert [t for t, _ in records] == [e[0] for e in examples]
    assert [m for _, m in records] == [e[1] for e in examples]
    trained = tok.decode([t for seq, m in zip(tokens, masks) for t, keep in zip(seq, m) if keep])
    assert "It is 4." in trained and "chat" in trained and "Goodbye." in trained
    assert "What is 2+2?" not in trained and "Translate" not in trained
    assert summary.records == len(SFT_RECORDS) and summary.extra["packs"] == len(token_docs) - 1
    assert summary.documents == len(token_docs) - 1 and summary.sequences == len(tokens)
    assert summary.extra["truncated"] == 0 and max(map(len, (e[0] for e in examples))) < 256
    padding = [t for t, m in zip(tokens, masks) if not any(m)]
    assert padding and all(set(t) == {tok.pad_id} for t in padding)  # the tokenizer's own pad id: <pad>
    assert tok.pad_id != tok.eod_id and summary.extra["padding_note"] is None


def test_sft_counts_agree_with_dataset_inspect_and_say_what_they_count(tmp_path, bpe, capsys):
    from pai_zoo.cli import main
    from pai_zoo.data.indexed import statistics

    src = tmp_path / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in SFT_RECORDS))
    assert main(["preprocess", "--sft", "--input", str(src), "--output-prefix", str(tmp_path / "sft"),
                 "--tokenizer", str(bpe), "--seq-length", "256"]) == 0
    line = capsys.readouterr().out
    stats = statistics(output_prefix(tmp_path / "sft", "text"))
    padding = stats["sequences"] - len(SFT_RECORDS)
    assert padding > 0 and stats["documents"] < len(SFT_RECORDS)
    assert line.startswith(f"{len(SFT_RECORDS)} records -> {stats['documents']} documents (packed sequences; "
                           f"{stats['sequences']} sequences = {len(SFT_RECORDS)} records + {padding} padding), "
                           f"{stats['tokens']} tokens"), line
    assert main(["dataset", "inspect", str(tmp_path / "sft")]) == 0  # the SFT prefix, without _text_document
    out = capsys.readouterr().out
    assert f"documents:             {stats['documents']}\n" in out
    assert f"sequences:             {stats['sequences']}\n" in out
    assert f"records:               {len(SFT_RECORDS)}\n" in out
    assert (f"SFT data: {len(SFT_RECORDS)} chat records packed into {stats['documents']} documents (one per packed "
            f"sequence); {stats['sequences']} sequences = {len(SFT_RECORDS)} records + {padding} padding") in out
    assert main(["preprocess", "--sft", "--no-pack", "--input", str(src), "--output-prefix", str(tmp_path / "flat"),
                 "--tokenizer", str(bpe)]) == 0
    assert capsys.readouterr().out.startswith(f"{len(SFT_RECORDS)} records -> {len(SFT_RECORDS)} documents "
                                              "(one record each)")


def test_sft_without_a_pad_token_pads_with_eod_and_says_so(tmp_path, bpe):
    from pai_zoo.data.preprocess import preprocess_sft

    folder = tmp_path / "nopad"
    shutil.copytree(bpe, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tok = load_tokenizer(folder)
    assert tok.pad_id is None
    src = tmp_path / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in SFT_RECORDS[:3]))
    summary = preprocess_sft([src], tmp_path / "sft", folder, seq_length=256)
    assert summary.extra["pad_id"] == tok.eod_id
    assert (f"the tokenizer has no pad token: padded with the end-of-document token '</s>' (id {tok.eod_id}; "
            "loss mask 0") in summary.line()


def test_sft_bad_record_names_file_and_line(tmp_path, bpe):
    from pai_zoo.data.preprocess import preprocess_sft

    src = tmp_path / "records.jsonl"
    src.write_text(
        json.dumps(SFT_RECORDS[0]) + "\n" + json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n"
    )
    with pytest.raises(BadRecord, match=r"records.jsonl:2: "):
        preprocess_sft([src], tmp_path / "sft", bpe, seq_length=64)
    assert outputs_present(tmp_path / "sft") == []
