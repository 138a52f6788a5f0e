"""preprocess --engine: the fast engine (gigatoken) gives the exact engine's and transformers' ids for every
tokenizer kind, byte for byte in the written datasets; a broken or unsupported fast tokenizer falls back (auto)
or fails (--engine fast)."""
import gzip
import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.data.blocks import read_blocks
from pai_zoo.data.preprocess import output_prefix, preprocess
from pai_zoo.plugin.errors import PaiZooWarning
from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE
from pai_zoo.tokenizers import fast as fast_module
from pai_zoo.tokenizers.fast import FastEngineMismatch, FastEngineUnavailable, fast_tokenizer

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def _corpus(specials) -> list[str]:
    """Texts unlike the engine check's own: random words, digits, CJK, emoji, whitespace, special tokens inside."""
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzé") for _ in range(rng.randint(1, 12))) for _ in range(300)]
    extras = ["你好", "世界", "🙂", "👍🏽", "\u212a", "ﬁ", "12345", "\t", "  ", "\n\n", "It's", "x" * 700]
    texts = [t for t in SAMPLE_TEXT]
    for i in range(120):
        parts = [rng.choice(words) if rng.random() < 0.8 else rng.choice(extras) for _ in range(rng.randint(3, 60))]
        if specials and i % 9 == 0:
            parts.insert(rng.randint(0, len(parts)), rng.choice(specials))
        texts.append(rng.choice([" ", "", "  "]).join(parts))
    return [t for t in texts if t.strip()]


def _gpt2(folder):
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    return ByteLevelBPE(config=config, special_tokens=("<|endoftext|>",), vocab_size=450)(folder)


def _family(name):
    def write(folder):
        from pai_zoo.families.registry import get_registry

        get_registry().family(name).test_tokenizer(folder)
        return folder
    return write


def _mistral(folder):
    """The Llama-2-style SentencePiece model (32000 pieces) that mistral-common ships."""
    from pai_zoo_llama.tokenizer_files import write_test_tokenizer

    write_test_tokenizer(folder)
    return folder


def _qwen_tiktoken(folder):
    from pai_zoo_qwen.tokenizer_files import write_qwen_tiktoken_tokenizer

    write_qwen_tiktoken_tokenizer(folder)
    return folder


#: (writer, family for --tokenizer, whether gigatoken 0.10 runs it)
KINDS = {
    "qwen2 byte-level BPE": (_family("qwen2"), "qwen2", True),
    "gpt2 byte-level BPE": (_gpt2, None, True),
    "starcoder byte-level BPE": (_family("starcoder"), "starcoder", False),  # Digits+ByteLevel: no gigatoken
    "llama-2 sentencepiece (32000)": (_mistral, "llama", True),
    "baichuan sentencepiece": (_family("baichuan"), "baichuan", True),
    "chatglm sentencepiece": (_family("chatglm"), "chatglm", True),
    "qwen v1 tiktoken": (_qwen_tiktoken, "qwen", True),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {kind: writer(tmp_path_factory.mktemp(kind.split()[0].replace(".", ""))) for kind, (writer, _, _) in
            KINDS.items()}


def _ref(folder, family):
    from pai_zoo.tokenizers.names import TokenizerRef

    return TokenizerRef(str(folder), family)


def _jsonl(path: Path, texts, key="text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({key: text}, ensure_ascii=False) + "\n")
    return path


def _read(prefix):
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


@pytest.mark.parametrize("kind", list(KINDS))
def test_both_engines_write_the_same_bytes_for_every_tokenizer_kind(tmp_path, folders, kind, monkeypatch):
    _, family, supported = KINDS[kind]
    folder = folders[kind]
    ref = _ref(folder, family)
    monkeypatch.setattr("pai_zoo.data.preprocess.resolve_tokenizer", lambda _name: ref)
    exact = ref.load()
    specials = [t for t in exact.special_tokens_map.values() if isinstance(t, str)]
    src = _jsonl(tmp_path / "in.jsonl", _corpus(specials))
    hf = preprocess([src], tmp_path / "hf", "tok", engine="hf", append_eod=exact.eod_id is not None,
                    batch_size=16)
    assert hf.engine.startswith("hf (")
    if not supported:
        with pytest.raises(FastEngineUnavailable, match="--engine fast: .*gigatoken cannot load it"):
            preprocess([src], tmp_path / "fast", "tok", engine="fast")
        with pytest.warns(PaiZooWarning, match="gigatoken cannot load it.*the exact engine encodes the text"):
            auto = preprocess([src], tmp_path / "auto", "tok", append_eod=exact.eod_id is not None)
        assert auto.engine.startswith("hf (")
        assert _read(output_prefix(tmp_path / "auto", "text")) == _read(output_prefix(tmp_path / "hf", "text"))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaiZooWarning)  # verified: no fallback
        fast = preprocess([src], tmp_path / "fast", "tok", engine="fast", append_eod=exact.eod_id is not None,
                          batch_bytes=3000, workers=2)
    assert fast.engine.startswith("fast (gigatoken 0.10")
    assert (fast.documents, fast.tokens, fast.bytes) == (hf.documents, hf.tokens, hf.bytes)
    assert _read(output_prefix(tmp_path / "fast", "text")) == _read(output_prefix(tmp_path / "hf", "text"))


#: Kinds transformers reads without remote code from the folders written above (ChatGLM's and Qwen v1's folders
#: carry a transformers-side tokenizer.json converted from the same model for this purpose).
TRANSFORMERS_KINDS = [k for k in KINDS if KINDS[k][2]]


@pytest.mark.parametrize("kind", TRANSFORMERS_KINDS)
def test_fast_ids_are_transformers_ids(folders, kind):
    from transformers import AutoTokenizer

    _, family, _ = KINDS[kind]
    fast = fast_tokenizer(_ref(folders[kind], family).load(), threads=2)
    auto = AutoTokenizer.from_pretrained(str(folders[kind]))
    specials = [t for t in fast.special_tokens_map.values() if isinstance(t, str)]
    texts = _corpus(specials) + list(fast_module.hard_strings(fast.exact))
    assert fast.encode_batch(texts) == [auto.encode(t) for t in texts]
    assert fast.encode_batch(texts, add_special_tokens=False) == [auto.encode(t, add_special_tokens=False)
                                                                  for t in texts]


class _Broken:
    """A gigatoken tokenizer with a bug: it encodes ``needle`` as ``replacement`` (a wrong normalisation)."""

    def __init__(self, real, needle, replacement):
        self.real, self.needle, self.replacement = real, needle, replacement

    def encode(self, text):
        return self.real.encode(text.replace(self.needle, self.replacement))

    def encode_batch(self, texts, parallel=None):
        return self.real.encode_batch([t.replace(self.needle, self.replacement) for t in texts], parallel=parallel)


@pytest.fixture()
def qwen2(folders, monkeypatch):
    ref = _ref(folders["qwen2 byte-level BPE"], "qwen2")
    monkeypatch.setattr("pai_zoo.data.preprocess.resolve_tokenizer", lambda _name: ref)
    return ref


def _break(monkeypatch, needle, replacement):
    real = fast_module._backend
    monkeypatch.setattr(fast_module, "_backend", lambda exact: _Broken(real(exact), needle, replacement))


@pytest.mark.parametrize(("needle", "where"), [
    ("\u212a", "\u212a is the Kelvin sign"),  # caught by the fixed hard strings
    ("zqxjv", "only in this run's input: zqxjv"),  # caught only by the sample of the run's own input
])
def test_a_broken_fast_tokenizer_falls_back_or_fails(tmp_path, qwen2, monkeypatch, needle, where):
    texts = ["plain text one", "only in this run's input: zqxjv here", "plain text two"] * 3
    src = _jsonl(tmp_path / "in.jsonl", texts)
    _break(monkeypatch, needle, "k")
    with pytest.warns(PaiZooWarning) as caught:
        auto = preprocess([src], tmp_path / "auto", "tok")
    message = str(caught[0].message)
    assert "ids differ from the exact engine's on" in message and where in message
    assert "the exact engine encodes the text" in message
    assert auto.engine.startswith("hf (") and "engine hf (tokenizers)" in auto.line()
    hf = preprocess([src], tmp_path / "hf", "tok", engine="hf")
    assert _read(output_prefix(tmp_path / "auto", "text")) == _read(output_prefix(tmp_path / "hf", "text"))
    assert hf.tokens == auto.tokens
    with pytest.raises(FastEngineMismatch, match=f"--engine fast: the fast engine's ids differ .*{where}"):
        preprocess([src], tmp_path / "fast", "tok", engine="fast")
    assert not list(tmp_path.glob("fast*"))


def test_cli_engine_fast_mismatch_is_one_line_without_traceback(tmp_path, qwen2, monkeypatch, capsys):
    from pai_zoo.cli import main

    src = _jsonl(tmp_path / "in.jsonl", ["some text", "more text"])
    _break(monkeypatch, "\u212a", "k")
    code = main(["preprocess", "--input", src, "--output-prefix", tmp_path / "out", "--tokenizer", "x",
                 "--engine", "fast"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "--engine fast: the fast engine's ids differ from the exact engine's on '\u212a is the Kelvin" in err
    monkeypatch.undo()
    monkeypatch.setattr("pai_zoo.data.preprocess.resolve_tokenizer", lambda _name: qwen2)
    assert main(["preprocess", "--input", src, "--output-prefix", tmp_path / "out", "--tokenizer", "x"]) == 0
    assert "; engine fast (gigatoken 0.10.0, 1 threads)" in capsys.readouterr().out


def test_without_gigatoken_auto_is_the_exact_engine_and_fast_says_how_to_install(tmp_path, qwen2, monkeypatch):
    monkeypatch.setattr(fast_module, "fast_engine_installed", lambda: False)
    monkeypatch.setattr("pai_zoo.tokenizers.fast.fast_engine_installed", lambda: False)
    src = _jsonl(tmp_path / "in.jsonl", ["some text"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaiZooWarning)
        assert preprocess([src], tmp_path / "auto", "tok").engine == "hf (tokenizers)"
    with pytest.raises(FastEngineUnavailable, match=r"needs gigatoken: pip install 'pai-zoo\[fast\]'"):
        preprocess([src], tmp_path / "fast", "tok", engine="fast")


@pytest.mark.megatron
def test_fast_output_is_megatron_builder_bytes_for_every_worker_count_and_compression(tmp_path, qwen2):
    import zstandard
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    texts = _corpus(["<|im_end|>"])
    lines = "".join(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n" for i, t in enumerate(texts))
    plain = tmp_path / "in.jsonl"
    plain.write_text(lines, encoding="utf-8")
    with gzip.open(tmp_path / "in.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(lines)
    (tmp_path / "in.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    exact = qwen2.load()
    builder = IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    for text in texts:
        ids = exact.encode(text) + [exact.eod_id]
        builder.add_document(np.array(ids, dtype=np.int64), [len(ids)])
    builder.finalize(str(tmp_path / "mc.idx"))
    want = _read(tmp_path / "mc")
    for name, workers in (("in.jsonl", 1), ("in.jsonl", 3), ("in.jsonl.gz", 2), ("in.jsonl.zst", 1)):
        out = tmp_path / f"out-{name}-{workers}"
        summary = preprocess([tmp_path / name], out, "tok", engine="fast", append_eod=True, workers=workers,
                             batch_bytes=5000)
        assert summary.engine.startswith("fast") and summary.documents == len(texts)
        assert _read(output_prefix(out, "text")) == want, (name, workers)
        assert set(summary.profile) == {"check", "read", "parse", "encode", "write"}


def test_blocks_carry_lines_across_reads_in_compressed_streams(tmp_path):
    lines = [("x" * (i * 37 % 101)).encode() + b"\xc3\xa9" for i in range(60)] + [b"last line, no newline"]
    data = b"\n".join(lines)
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as f:
        f.write(data)
    got, numbers = [], []
    for number, block in read_blocks(tmp_path / "a.jsonl.gz", block_size=13):
        numbers.append(number)
        got += block
    assert got == lines
    assert numbers[0] == 1 and all(b > a for a, b in zip(numbers, numbers[1:]))


def test_the_fast_engine_drops_its_caches_when_the_process_grows(tmp_path, qwen2, monkeypatch):
    rss = iter(range(0, 10 ** 12, 300 << 20))  # every reading 300 MB more than the last
    monkeypatch.setattr(fast_module, "_rss", lambda: next(rss))
    texts = _corpus(["<|im_end|>"])
    exact = qwen2.load()
    fast = fast_tokenizer(exact)
    first = fast._gt
    assert fast.bound_memory(1 << 40) is False and fast._gt is first
    assert fast.bound_memory(200 << 20) is True and fast._gt is not first and fast.cache_resets == 1
    assert fast.encode_batch(texts) == exact.encode_batch(texts)
    src = _jsonl(tmp_path / "in.jsonl", texts)
    summary = preprocess([src], tmp_path / "out", "tok", engine="fast", batch_bytes=2000)
    assert summary.extra["cache_resets"] >= 2  # about every third batch here; the same bytes as the exact engine
    preprocess([src], tmp_path / "hf", "tok", engine="hf")
    assert _read(output_prefix(tmp_path / "out", "text")) == _read(output_prefix(tmp_path / "hf", "text"))
