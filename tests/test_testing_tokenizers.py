"""The test-tokenizer writers of :mod:`pai_zoo.testing.tokenizers` (the one mechanism behind every family's
``Family.test_tokenizer`` and the toy tokenizer): special-token ids, pre-tokenization options, prefixes and
config files, each read back by transformers' ``AutoTokenizer`` or the engine that real checkpoints use."""
from __future__ import annotations

import json

import pytest

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE, SentencePieceBPE, TiktokenBPE, write_json
from pai_zoo.tokenizers import QWEN_PAT_STR, read_tiktoken_ranks

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

SPECIALS = ("<|endoftext|>", "<a>", "<b>")
CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": "{{ 1 }}"}


def _auto(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_byte_level_bpe_numbers_special_tokens_first_and_writes_the_config(tmp_path):
    ByteLevelBPE(config=CONFIG, special_tokens=SPECIALS, vocab_size=300)(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == CONFIG
    tok = _auto(tmp_path)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2]
    assert len(tok) == 300
    text = "".join(SAMPLE_TEXT)
    ids = tok(f"<a>{text}<b>")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids[1:-1]) == text


def test_byte_level_bpe_appends_special_tokens_after_the_vocabulary_with_a_prefix(tmp_path):
    ByteLevelBPE(config=CONFIG, special_tokens=SPECIALS, specials_first=False, prefix=("<a>", "<b>"),
                 added_tokens_in_config=True, trim_offsets=False, vocab_size=300)(tmp_path)
    tok = _auto(tmp_path)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIALS] == [300, 301, 302]
    ids = tok("hello world")["input_ids"]
    assert ids[:2] == [301, 302] and tok.decode(ids[2:]) == "hello world"
    assert tok("hello world", add_special_tokens=False)["input_ids"] == ids[2:]
    decoder = json.loads((tmp_path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {k: v["content"] for k, v in decoder.items()} == {"300": "<|endoftext|>", "301": "<a>", "302": "<b>"}
    assert all(v["special"] for v in decoder.values())


@pytest.mark.parametrize(("steps", "pieces"), [
    (("single_digits", "byte_level"), ["1", "2", "3", "4", "5"]),
    (("byte_level", "digits"), ["12345"]),
])
def test_byte_level_bpe_digit_options(tmp_path, steps, pieces):
    corpus = ("12345 12345 12345 and 678\n",) * 50
    ByteLevelBPE(config=CONFIG, corpus=corpus, pre_tokenizers=steps, vocab_size=300)(tmp_path)
    tok = _auto(tmp_path)
    assert tok.tokenize("12345") == pieces


def test_byte_level_bpe_split_pattern_and_nfc(tmp_path):
    ByteLevelBPE(config=CONFIG, pre_tokenizers=("split", "byte_level"), split_pattern=QWEN_PAT_STR, nfc=True,
                 vocab_size=300)(tmp_path)
    tok = _auto(tmp_path)
    assert tok.tokenize("2024") == ["2", "0", "2", "4"]  # Qwen's pattern: one digit per pre-token
    assert tok("e\u0301")["input_ids"] == tok("\u00e9")["input_ids"]  # NFC first


def test_byte_level_bpe_rejects_inconsistent_options():
    with pytest.raises(ValueError, match="unknown pre-tokenizer steps \\['bytes'\\]"):
        ByteLevelBPE(config=CONFIG, pre_tokenizers=("bytes",))
    with pytest.raises(ValueError, match="split_pattern"):
        ByteLevelBPE(config=CONFIG, pre_tokenizers=("split", "byte_level"))
    with pytest.raises(ValueError, match="prefix tokens \\['<x>'\\]"):
        ByteLevelBPE(config=CONFIG, special_tokens=SPECIALS, prefix=("<x>",))
    with pytest.raises(ValueError, match="tokenizer_json"):
        SentencePieceBPE(config=CONFIG, special_tokens=SPECIALS)


def test_sentencepiece_bpe_model_options_and_converted_tokenizer_json(tmp_path):
    import sentencepiece as spm

    config = {"tokenizer_class": "ChatGLMTokenizer", "eos_token": "</s>", "unk_token": "<unk>"}
    SentencePieceBPE(config=config, vocab_size=500, tokenizer_json=True, special_tokens=("[gMASK]", "sop"),
                     prefix=("[gMASK]", "sop"), options={"allow_whitespace_only_pieces": True})(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer.model", "tokenizer_config.json"]
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    assert sp.get_piece_size() == 500
    assert [sp.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    assert sp.encode("2024", out_type=str)[-4:] == ["2", "0", "2", "4"]  # split_digits
    assert sp.piece_to_id("<0x0A>") != sp.unk_id()  # byte fallback
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == config
    from tokenizers import Tokenizer

    converted = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [converted.token_to_id(t) for t in ("[gMASK]", "sop")] == [500, 501]
    text = "Hello, world! 你好"
    assert converted.encode(text).ids == [500, 501, *sp.encode(text)]


def test_tiktoken_bpe_ranks_and_converted_tokenizer_json(tmp_path):
    import tiktoken

    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    TiktokenBPE(pattern=QWEN_PAT_STR, config=config, file_name="x.tiktoken", special_tokens=SPECIALS,
                vocab_size=300)(tmp_path)
    ranks = read_tiktoken_ranks(tmp_path / "x.tiktoken")
    assert len(ranks) == 300 and sorted(ranks.values()) == list(range(300))
    assert sorted(t for t, r in ranks.items() if len(t) == 1) == [bytes([b]) for b in range(256)]
    enc = tiktoken.Encoding("x", pat_str=QWEN_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    tok = _auto(tmp_path)
    for text in SAMPLE_TEXT:
        assert tok(text, add_special_tokens=False)["input_ids"] == enc.encode(text), text
    assert [tok.convert_tokens_to_ids(t) for t in SPECIALS] == [300, 301, 302]
    assert not list(tmp_path.glob("*.tmp"))


def test_write_json_replaces_atomically(tmp_path):
    path = write_json(tmp_path / "a.json", {"x": "你好"})
    write_json(path, {"y": 1})
    assert json.loads(path.read_text(encoding="utf-8")) == {"y": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_toy_tokenizer_uses_the_helper(tmp_path):
    from pai_zoo.data.toy import CHATML, SPECIAL_TOKENS, sentences, write_tokenizer

    write_tokenizer(tmp_path, vocab_size=350)
    tok = _auto(tmp_path)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2] and len(tok) == 350
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    sentence = sentences(1, seed=7)[0]
    assert tok.decode(tok(sentence)["input_ids"]) == sentence
