"""Tests of pai_zoo.data.indexed against megatron-core's own IndexedDatasetBuilder / IndexedDataset.

megatron-core's reader (``IndexedDataset``) unmaps its files in ``__del__`` while arrays it returned may
still point into them (reading one afterwards segfaults), so every megatron dataset here stays alive
while its arrays are used and sequences are copied out with ``np.array``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.data.indexed import IndexedDatasetReader, IndexedDatasetWriter, layout, merge, optimal_dtype, statistics

REPO = Path(__file__).resolve().parents[1]

# megatron's builder passes torch tensors to numpy.array(..., dtype=...), which numpy 2 warns about
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


@pytest.fixture(scope="module")
def mc():
    """megatron-core's indexed_dataset module (imports torch)."""
    from megatron.core.datasets import indexed_dataset

    return indexed_dataset


def random_docs(seed: int, n_docs: int, high: int, empty: bool = True):
    """Documents as (tokens, lengths): several sequences each, some empty sequences and an empty document."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        lengths = [int(x) for x in rng.integers(0 if empty else 1, 9, size=int(rng.integers(1, 5)))]
        docs.append((rng.integers(0, high, size=sum(lengths)), lengths))
    if empty:
        docs.insert(2, (np.zeros(0, np.int64), []))  # a document with no sequences
        docs.append((np.zeros(0, np.int64), [0]))  # ends on an empty sequence
    return docs


def megatron_build(mc, prefix: Path, dtype, docs):
    import torch

    builder = mc.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for tokens, lengths in docs:
        builder.add_document(torch.from_numpy(np.asarray(tokens)), lengths)
    builder.finalize(f"{prefix}.idx")


def ours_build(prefix: Path, dtype, docs):
    with IndexedDatasetWriter(prefix, dtype) as w:
        for tokens, lengths in docs:
            w.add_document(tokens, lengths)
    return w


def assert_same_files(a: Path, b: Path):
    for ext in (".bin", ".idx"):
        assert Path(f"{a}{ext}").read_bytes() == Path(f"{b}{ext}").read_bytes(), ext


def sequences_of(docs):
    out = []
    for tokens, lengths in docs:
        out.extend(np.split(np.asarray(tokens), np.cumsum(lengths)[:-1]) if lengths else [])
    return out


def test_optimal_dtype_is_megatrons_rule(mc):
    for vocab in (0, 256, 32000, 65499, 65500, 65535, 65536, 128256, 2**31 - 1):
        assert optimal_dtype(vocab) == np.dtype(mc.DType.optimal_dtype(vocab)), vocab
    assert optimal_dtype(65499) == np.uint16 and optimal_dtype(65500) == np.int32


@pytest.mark.parametrize("dtype, chunk", [(np.uint16, None), (np.int32, None), (np.uint16, 3)])
def test_add_document_byte_identical_and_megatron_reads_it(mc, tmp_path, monkeypatch, dtype, chunk):
    if chunk:  # the index is written in chunks of this many entries
        monkeypatch.setattr(layout, "_CHUNK", chunk)
    high = 65500 if dtype is np.uint16 else 2**31 - 1
    docs = random_docs(1, 12, high)
    megatron_build(mc, tmp_path / "mc", dtype, docs)
    w = ours_build(tmp_path / "ours", dtype, docs)
    assert_same_files(tmp_path / "mc", tmp_path / "ours")
    assert (w.documents_written, w.sequences_written) == (len(docs), sum(len(ids) for _, ids in docs))
    assert w.tokens_written == sum(len(t) for t, _ in docs)

    expected = sequences_of(docs)
    ds = mc.IndexedDataset(str(tmp_path / "ours"))
    try:
        assert len(ds) == len(expected) and ds.index.dtype == dtype
        for i, seq in enumerate(expected):
            np.testing.assert_array_equal(np.array(ds[i]), seq)
        np.testing.assert_array_equal(ds.document_indices, np.cumsum([0] + [len(ids) for _, ids in docs]))
        got = [np.array(s) for s in ds[0 : len(ds)]]
    finally:
        del ds
    assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64])
def test_add_item_end_document_byte_identical(mc, tmp_path, dtype):
    import torch

    info = np.iinfo(dtype)
    rng = np.random.default_rng(2)
    builder = mc.IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=dtype)
    with IndexedDatasetWriter(tmp_path / "ours", np.dtype(dtype)) as w:
        for doc in range(6):
            for _ in range(int(rng.integers(0, 4))):
                seq = rng.integers(info.min, int(info.max) + 1, size=int(rng.integers(0, 7)), dtype=np.int64)
                builder.add_item(torch.from_numpy(seq))
                w.add_item(torch.from_numpy(seq) if doc % 2 else seq.tolist())  # tensors and lists alike
            builder.end_document()
            w.end_document()
    builder.finalize(str(tmp_path / "mc.idx"))
    assert_same_files(tmp_path / "mc", tmp_path / "ours")


def test_our_reader_reads_megatron_files(mc, tmp_path, monkeypatch):
    docs = random_docs(3, 10, 50000)
    megatron_build(mc, tmp_path / "mc", np.uint16, docs)
    with IndexedDatasetReader(tmp_path / "mc") as r:
        assert r.dtype == np.uint16 and r.num_documents == len(docs)
        expected = sequences_of(docs)
        assert len(r) == len(expected) and r.num_tokens == sum(map(len, expected))
        for i, seq in enumerate(expected):
            np.testing.assert_array_equal(r[i], seq)
        for j, (tokens, _) in enumerate(docs):
            np.testing.assert_array_equal(r.document(j), tokens)
        np.testing.assert_array_equal(r.sequence_lengths, list(map(len, expected)))
        np.testing.assert_array_equal(r.sequence_pointers, 2 * np.cumsum([0] + list(map(len, expected)))[:-1])
        np.testing.assert_array_equal(r.document_indices, np.cumsum([0] + [len(ids) for _, ids in docs]))
        np.testing.assert_array_equal(r[-1], expected[-1])
        assert [list(s) for s in r[1:4]] == [list(s) for s in expected[1:4]]
        with pytest.raises(IndexError):
            r[len(expected)]
        with pytest.raises(IndexError):
            r.document(len(docs))
        assert r.document(2).size == 0  # the document without sequences
        r.verify()
        first, doc0 = r[0], r.document(0)
        monkeypatch.setattr(layout, "_CHUNK", 2)
        r.verify()  # chunked
    assert list(first) == list(expected[0]) and list(doc0) == list(docs[0][0])  # valid after close
    with pytest.raises(ValueError, match="closed"):
        len(r)


@pytest.mark.parametrize("chunk", [None, 2])
def test_merge_and_add_index_byte_identical_to_megatron(mc, tmp_path, monkeypatch, chunk):
    import torch

    if chunk:  # indices are copied and written in chunks of this many entries
        monkeypatch.setattr(layout, "_CHUNK", chunk)

    parts = []
    for k in range(3):
        prefix = tmp_path / f"part{k}"
        ours_build(prefix, np.int32, random_docs(10 + k, 4 + k, 10**6))
        parts.append(str(prefix))

    builder = mc.IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.int32)
    for p in parts:
        builder.add_index(p)
    builder.finalize(str(tmp_path / "mc.idx"))
    merge(parts, tmp_path / "merged")
    assert_same_files(tmp_path / "mc", tmp_path / "merged")

    # documents and whole datasets interleaved, as megatron's builder allows
    extra = random_docs(20, 3, 10**6)
    builder = mc.IndexedDatasetBuilder(str(tmp_path / "mc2.bin"), dtype=np.int32)
    builder.add_document(torch.from_numpy(extra[0][0]), extra[0][1])
    builder.add_index(parts[0])
    builder.add_document(torch.from_numpy(extra[1][0]), extra[1][1])
    builder.add_index(parts[2])
    builder.finalize(str(tmp_path / "mc2.idx"))
    with IndexedDatasetWriter(tmp_path / "ours2", np.int32) as w:
        w.add_document(*extra[0])
        w.add_index(parts[0])
        w.add_document(*extra[1])
        w.add_index(parts[2])
    assert_same_files(tmp_path / "mc2", tmp_path / "ours2")
    with IndexedDatasetReader(parts[0]) as a, IndexedDatasetReader(parts[2]) as b:
        assert w.sequences_written == len(a) + len(b) + len(extra[0][1]) + len(extra[1][1])
        assert w.tokens_written == a.num_tokens + b.num_tokens + len(extra[0][0]) + len(extra[1][0])
        assert w.documents_written == a.num_documents + b.num_documents + 2

    ds = mc.IndexedDataset(str(tmp_path / "merged"))
    try:
        merged_doc_indices = np.array(ds.document_indices)
    finally:
        del ds
    with IndexedDatasetReader(tmp_path / "merged") as r:
        np.testing.assert_array_equal(r.document_indices, merged_doc_indices)
        k = 0
        for p in parts:
            with IndexedDatasetReader(p) as src:
                for j in range(src.num_documents):
                    np.testing.assert_array_equal(r.document(k), src.document(j))
                    k += 1
        assert k == r.num_documents


def test_dtype_mismatch_and_merge_errors(tmp_path):
    ours_build(tmp_path / "a", np.uint16, random_docs(4, 3, 100))
    ours_build(tmp_path / "b", np.int32, random_docs(5, 3, 100))
    with pytest.raises(ValueError) as e:
        merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert f"{tmp_path / 'b'}.idx" in str(e.value) and f"{tmp_path / 'out'}.idx" in str(e.value)
    assert "int32" in str(e.value) and "uint16" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx", "b.bin", "b.idx"]  # nothing of out left
    with pytest.raises(ValueError, match="also an input"):
        merge([tmp_path / "a"], tmp_path / "a")
    with pytest.raises(ValueError, match="no datasets"):
        merge([], tmp_path / "out")
    with pytest.raises(ValueError, match="unsupported token dtype float32"):
        IndexedDatasetWriter(tmp_path / "f", np.float32)


@pytest.mark.parametrize(
    "dtype, tokens, bad",
    [
        (np.uint16, [1, 65536], "65536"),
        (np.uint16, np.array([-1, 5]), "-1"),
        (np.int8, np.array([128], dtype=np.int64), "128"),
        (np.int32, [2**31], "2147483648"),
        (np.int64, [2**70], str(2**70)),
    ],
)
def test_out_of_range_tokens_raise_and_write_nothing(tmp_path, dtype, tokens, bad):
    with IndexedDatasetWriter(tmp_path / "d", dtype) as w:
        w.add_document([1, 2, 3])
        for call in (lambda: w.add_item(tokens), lambda: w.add_document(tokens)):
            with pytest.raises(ValueError) as e:
                call()
            assert bad in str(e.value) and np.dtype(dtype).name in str(e.value)
        assert (w.sequences_written, w.tokens_written, w.documents_written) == (1, 3, 1)
    assert Path(f"{tmp_path / 'd'}.bin").stat().st_size == 3 * np.dtype(dtype).itemsize
    with IndexedDatasetReader(tmp_path / "d") as r:
        assert len(r) == 1 and list(r[0]) == [1, 2, 3]


def test_bad_token_values_and_lengths(tmp_path):
    with IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        with pytest.raises(ValueError, match="non-integral"):
            w.add_item([1.5])
        with pytest.raises(ValueError, match="integers"):
            w.add_item(["a"])
        with pytest.raises(ValueError, match="lengths sum to 2 but the document has 3 tokens"):
            w.add_document([1, 2, 3], [1, 1])
        with pytest.raises(ValueError, match="lengths"):
            w.add_document([1, 2, 3], [4, -1])
        w.add_item(np.array([7.0, 8.0]))  # integral floats are fine
        w.add_item(np.array([[1, 2], [3, 4]]))  # flattened in C order, as megatron's tobytes does
        w.end_document()
        assert w.sequences_written == 2 and w.tokens_written == 6
    with IndexedDatasetReader(tmp_path / "d") as r:
        assert [list(r[0]), list(r[1])] == [[7, 8], [1, 2, 3, 4]]


def corrupt(path: str, offset: int, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_corrupt_and_truncated_files(tmp_path, monkeypatch):
    good = tmp_path / "good"
    ours_build(good, np.uint16, random_docs(6, 5, 1000, empty=False))
    idx, bin_ = Path(f"{good}.idx").read_bytes(), Path(f"{good}.bin").read_bytes()
    n = int.from_bytes(idx[18:26], "little")
    cases = {
        "truncated bin": (idx, bin_[:-2], ".bin", "truncated"),
        "longer bin": (idx, bin_ + b"\0\0", ".bin", "too long"),
        "truncated idx": (idx[:-8], bin_, ".idx", "truncated"),
        "header only part": (idx[:20], bin_, ".idx", "header"),
        "bad magic": (b"XXIDIDX\0\0" + idx[9:], bin_, ".idx", "magic"),
        "bad version": (idx[:9] + (2).to_bytes(8, "little") + idx[17:], bin_, ".idx", "version 2"),
        "bad dtype code": (idx[:17] + bytes([9]) + idx[18:], bin_, ".idx", "dtype code 9"),
        "bad sequence count": (idx[:18] + (n + 1).to_bytes(8, "little") + idx[26:], bin_, ".idx", "needs"),
        "bad document end": (idx[:-8] + (n - 1).to_bytes(8, "little"), bin_, ".idx", "document_indices"),
    }
    for name, (idx_bytes, bin_bytes, bad_ext, what) in cases.items():
        prefix = tmp_path / name.replace(" ", "_")
        Path(f"{prefix}.idx").write_bytes(idx_bytes)
        Path(f"{prefix}.bin").write_bytes(bin_bytes)
        with pytest.raises(ValueError) as e:
            IndexedDatasetReader(prefix)
        assert f"{prefix}{bad_ext}" in str(e.value) and what in str(e.value), (name, str(e.value))
        with pytest.raises(ValueError):
            statistics(prefix)

    # lengths swapped inside the index: the sizes still match, verify() and statistics see it
    prefix = tmp_path / "inner"
    Path(f"{prefix}.bin").write_bytes(bin_)
    Path(f"{prefix}.idx").write_bytes(idx)
    corrupt(f"{prefix}.idx", 34, (int.from_bytes(idx[34:38], "little") + 1).to_bytes(4, "little"))
    with IndexedDatasetReader(prefix) as r:
        with pytest.raises(ValueError, match="sequence 1 points at byte"):
            r.verify()
    with pytest.raises(ValueError, match="lengths sum to"):
        statistics(prefix)
    prefix = tmp_path / "order"  # a document index out of order
    Path(f"{prefix}.bin").write_bytes(bin_)
    Path(f"{prefix}.idx").write_bytes(idx)
    corrupt(f"{prefix}.idx", 34 + 12 * n + 8, n.to_bytes(8, "little"))
    with IndexedDatasetReader(prefix) as r:
        for chunk in (1 << 20, 2):  # with 2, the decrease straddles a chunk boundary
            monkeypatch.setattr(layout, "_CHUNK", chunk)
            with pytest.raises(ValueError, match=f"{prefix}.idx: corrupt: document_indices decrease"):
                r.verify()
    with pytest.raises(FileNotFoundError):
        IndexedDatasetReader(tmp_path / "missing")


def test_exception_inside_with_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
            w.add_document(np.arange(1000))
            assert len(os.listdir(tmp_path)) == 1  # the .bin temporary, streamed
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        w.add_item([1])

    # an old complete pair stays untouched by an aborted rewrite
    ours_build(tmp_path / "d", np.uint16, [([5, 6], [2])])
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(KeyError):
        with IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
            w.add_document([1, 2, 3])
            raise KeyError
    assert sorted(os.listdir(tmp_path)) == before == ["d.bin", "d.idx"]
    with IndexedDatasetReader(tmp_path / "d") as r:
        assert list(r[0]) == [5, 6]

    # leaving the block with sequences outside any document fails and leaves nothing
    with pytest.raises(ValueError, match="end_document"):
        with IndexedDatasetWriter(tmp_path / "e", np.uint16) as w:
            w.add_item([1, 2])
    assert sorted(os.listdir(tmp_path)) == ["d.bin", "d.idx"]


def test_finalize_writes_temporaries_then_renames_bin_before_idx(tmp_path, monkeypatch):
    prefix = tmp_path / "d"
    w = IndexedDatasetWriter(prefix, np.int32)
    w.add_item([1, 2, 3])
    with pytest.raises(ValueError, match="1 sequence"):
        w.finalize()  # not ended: refused, the writer stays usable
    w.end_document()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 1 and names[0].startswith(f".d.bin.pai-zoo-tmp-{os.getpid()}-")
    assert not Path(f"{prefix}.bin").exists() and not Path(f"{prefix}.idx").exists()

    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a, b)), real_replace(a, b)))
    w.finalize()
    monkeypatch.undo()
    assert [Path(b).name for _, b in renames] == ["d.bin", "d.idx"]
    assert [Path(a).name.split(".pai-zoo-tmp-")[0] for a, _ in renames] == [".d.bin", ".d.idx"]
    assert sorted(os.listdir(tmp_path)) == ["d.bin", "d.idx"]
    with pytest.raises(ValueError, match="finalized"):
        w.add_item([1])
    w.abort()  # after finalize: a no-op
    assert sorted(os.listdir(tmp_path)) == ["d.bin", "d.idx"]

    # a crash between the two renames: the new .bin is there, no .idx (the stale one was removed first)
    def fail_on_idx(a, b):
        if b.endswith(".idx"):
            raise OSError("disk gone")
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", fail_on_idx)
    with pytest.raises(OSError, match="disk gone"):
        with IndexedDatasetWriter(prefix, np.int32) as w2:
            w2.add_document([9, 9])
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["d.bin"]


def test_statistics(tmp_path):
    docs = random_docs(7, 9, 3000)
    ours_build(tmp_path / "d", np.uint16, docs)
    seqs = sequences_of(docs)
    tokens = np.concatenate([t for t, _ in docs])
    lengths = np.array([len(s) for s in seqs])
    expected = {
        "sequences": len(seqs),
        "documents": len(docs),
        "tokens": len(tokens),
        "dtype": "uint16",
        "min_sequence_length": int(lengths.min()),
        "max_sequence_length": int(lengths.max()),
        "mean_sequence_length": pytest.approx(lengths.mean()),
        "min_token_id": int(tokens.min()),
        "max_token_id": int(tokens.max()),
    }
    assert expected["min_sequence_length"] == 0
    for chunk in (1, 3, 1 << 20):  # chunk boundaries inside sequences and inside the data
        assert statistics(tmp_path / "d", chunk_size=chunk) == expected

    ours_build(tmp_path / "e", np.int32, [([], [0])])  # megatron's reader cannot map its empty .bin; ours can
    assert statistics(tmp_path / "e") == {
        "sequences": 1, "documents": 1, "tokens": 0, "dtype": "int32", "min_sequence_length": 0,
        "max_sequence_length": 0, "mean_sequence_length": 0.0, "min_token_id": None, "max_token_id": None,
    }
    with IndexedDatasetWriter(tmp_path / "z", np.int32):
        pass
    stats = statistics(tmp_path / "z")
    assert (stats["sequences"], stats["documents"], stats["mean_sequence_length"]) == (0, 0, None)
    with IndexedDatasetReader(tmp_path / "z") as r:
        assert len(r) == 0 and r.num_documents == 0 and r.num_tokens == 0


def test_import_pulls_in_neither_torch_nor_megatron():
    code = (
        "import sys, pai_zoo.data.indexed\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_add_documents_equals_one_add_document_per_document(tmp_path):
    docs = [[1, 2, 3], [], [7], [4, 5]]
    with IndexedDatasetWriter(tmp_path / "one", np.uint16) as w:
        for d in docs:
            w.add_document(d)
    with IndexedDatasetWriter(tmp_path / "batch", np.uint16) as w:
        w.add_documents(np.array([1, 2, 3, 7, 4, 5]), [3, 0, 1, 2])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"one{suffix}").read_bytes() == (tmp_path / f"batch{suffix}").read_bytes()
    with IndexedDatasetWriter(tmp_path / "bad", np.uint16) as w:
        with pytest.raises(ValueError, match="lengths sum to 2 but 3 tokens"):
            w.add_documents([1, 2, 3], [1, 1])
        w.add_item([1])
        with pytest.raises(ValueError, match="end the current document first"):
            w.add_documents([1], [1])
        w.end_document()


def test_writer_makes_the_prefix_folder(tmp_path):
    """--output-prefix data/corpus in a folder without data/ writes data/corpus.bin/.idx (it used to fail on the
    temporary file's name)."""
    with IndexedDatasetWriter(tmp_path / "new" / "deeper" / "corpus", np.int32) as writer:
        writer.add_document([1, 2, 3])
    assert (tmp_path / "new" / "deeper" / "corpus.bin").stat().st_size == 12
    assert (tmp_path / "new" / "deeper" / "corpus.idx").is_file()


def test_statistics_take_the_token_id_range_from_the_sidecar_unless_full(tmp_path, capsys):
    from pai_zoo.cli import main

    docs = random_docs(5, 4, 900)
    with IndexedDatasetWriter(tmp_path / "s", np.uint16, {"tokenizer": None}) as w:
        for tokens, lengths in docs:
            w.add_document(tokens, lengths)
    tokens = np.concatenate([t for t, _ in docs])
    assert statistics(tmp_path / "s")["max_token_id"] == int(tokens.max()) < 900
    # The same number of bytes, other ids: only a full read sees them (the sidecar still matches the sizes).
    Path(f"{tmp_path / 's'}.bin").write_bytes(b"\xff" * (2 * tokens.size))
    assert (statistics(tmp_path / "s")["min_token_id"], statistics(tmp_path / "s")["max_token_id"]) == (
        int(tokens.min()), int(tokens.max()))
    full = statistics(tmp_path / "s", full=True)
    assert (full["min_token_id"], full["max_token_id"]) == (65535, 65535)
    assert main(["dataset", "inspect", tmp_path / "s", "--full"]) == 0
    out = capsys.readouterr().out
    assert "max_token_id:          65535" in out and "token ids from:        .bin (read in full)" in out
    assert main(["dataset", "inspect", tmp_path / "s"]) == 0
    out = capsys.readouterr().out
    assert f"max_token_id:          {int(tokens.max())}" in out and "token ids from:        sidecar" in out
