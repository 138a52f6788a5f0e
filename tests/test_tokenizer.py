"""Tests of pai_zoo.tokenizers on small real tokenizers built here (no network).

* a byte-level BPE trained with ``tokenizers`` (tokenizer.json + tokenizer_config.json),
* a SentencePiece BPE trained with ``sentencepiece`` (byte fallback, CJK),
* Mistral-7B-v0.1's Llama-2-style SentencePiece model from ``mistral-common`` (``write_test_tokenizer``), and a
  Llama-2-style tokenizer.json built from it the way Llama-2 checkpoints ship it,
* a tiktoken rank file (256 bytes + merges learnt here).

Hugging Face and SentencePiece ids are compared with ``transformers.AutoTokenizer.from_pretrained(folder)``.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pai_zoo.plugin.errors import TokenizerError
from pai_zoo.tokenizers import (
    CL100K_PAT_STR,
    HFTokenizer,
    SentencePieceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
)

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = REPO / "plugins" / "pai-zoo-llama" / "pai_zoo_llama" / "tokenizer_files.py"


def tokenizer_files_module():
    """plugins/pai-zoo-llama/pai_zoo_llama/tokenizer_files.py, loaded on its own (not through the plugin)."""
    spec = importlib.util.spec_from_file_location("_pai_zoo_llama_tokenizer_files", TOKENIZER_FILES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# --------------------------------------------------------------------------------------------------------------
# texts
# --------------------------------------------------------------------------------------------------------------
MIXED = (
    "Hello, world! The quick brown fox.  Two  spaces,   three.\tTab\t\ttabs\n\nBlank line above\n"
    "    indented code: x = 42  # comment\n你好，世界！ 🙂🚀 emoji\r\n trailing spaces   \n\tend"
)
TEXTS = [
    MIXED,
    "Hello world",
    "你好，世界",
    "🙂🚀",
    "a  b   c    d",
    "tabs\t\tand\nnewlines\n\n\n",
    "\n  starts with a newline",
    "   leading spaces",
    " one leading space",
    "\tleading tab",
    "trailing   ",
    "",
    " ",
    "x",
    "▁literal▁marker",
    "naïve café — “quotes” ≠ ascii",
    "digits 1234567890 and 3.14159",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there, 你好 🙂"},
    {"role": "assistant", "content": "Hello!  How can I help?"},
    {"role": "user", "content": "Tell me  a joke.\n\nPlease."},
]

WORDS = (
    "the quick brown fox jumps over lazy dog hello world model token tokenizer megatron data train "
    "learning rate batch layer attention head vocab merge byte pair encoding sentence piece python "
    "def return class import self value"
).split()
CJK = "你好世界中文测试模型数据训练我们的是一了不在有人这上"


def make_corpus(n_lines: int = 1500, seed: int = 0) -> list[str]:
    """Deterministic mixed text: English words, CJK, 🙂 (never 🚀), runs of spaces/tabs, code-like lines."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 12)):
            r = rng.random()
            if r < 0.6:
                parts.append(rng.choice(WORDS).capitalize() if rng.random() < 0.1 else rng.choice(WORDS))
            elif r < 0.8:
                parts.append("".join(rng.choice(CJK) for _ in range(rng.randint(1, 4))))
            elif r < 0.85:
                parts.append("🙂")
            elif r < 0.95:
                parts.append(str(rng.randint(0, 9999)))
            else:
                parts.append(rng.choice([",", ".", "!", "?", "，", "。", "(x)", "= 1"]))
        sep = rng.choice([" ", " ", " ", "  ", "\t", "    "])
        lines.append(rng.choice(["", "", "    ", "\t"]) + sep.join(parts))
    return lines


def random_strings(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    pieces = list("abcdefgh ijklmnop  \t\n你好世界，🙂🚀,.!?0123456789é") + ["    ", "hello", "world", "▁"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def auto_tokenizer():
    from transformers import AutoTokenizer

    cache = {}

    def load(folder):
        key = str(folder)
        if key not in cache:
            cache[key] = AutoTokenizer.from_pretrained(key)
        return cache[key]

    return load


def assert_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=True) == text


# --------------------------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json (byte-level BPE)
# --------------------------------------------------------------------------------------------------------------
CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HF_SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]


def train_byte_level_bpe():
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(HF_SPECIALS) + 400,
        special_tokens=HF_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_corpus(), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|>:0 $A:0",
        pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    return tok


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """tokenizer.json whose post-processor adds BOS; a config with a dict-valued EOS and a PAD token that is not
    in the vocabulary (transformers appends it)."""
    folder = tmp_path_factory.mktemp("hf")
    train_byte_level_bpe().save(str(folder / "tokenizer.json"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": {
                "__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "rstrip": False, "normalized": False
            },
            "pad_token": "<|pad|>",
            "add_bos_token": False,  # ignored by transformers when tokenizer.json exists: the post-processor decides
            "chat_template": CHATML,
            "clean_up_tokenization_spaces": False,
        },
    )
    return folder


@pytest.fixture(scope="module")
def hf_plain_folder(tmp_path_factory) -> Path:
    """Same vocabulary, no post-processor; the config asks for a BOS that transformers does not add; special
    tokens come from special_tokens_map.json; the template from chat_template.jinja."""
    folder = tmp_path_factory.mktemp("hf_plain")
    tok = train_byte_level_bpe()
    data = json.loads(tok.to_str())
    data["post_processor"] = None
    write_json(folder / "tokenizer.json", data)
    write_json(folder / "tokenizer_config.json", {"add_bos_token": True, "bos_token": "<|begin_of_text|>"})
    write_json(folder / "special_tokens_map.json", {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    (folder / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    return folder


def test_hf_ids_match_transformers(hf_folder, auto_tokenizer):
    tok, ref = load_tokenizer(hf_folder), auto_tokenizer(hf_folder)
    assert isinstance(tok, HFTokenizer) and tok.kind == "hf"
    texts = TEXTS + random_strings(300) + ["<|im_start|>user\nhi<|im_end|>", "a<|pad|>b<|endoftext|>"]
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text
    assert tok.encode("hello")[0] == tok.bos_id  # the post-processor adds BOS
    assert tok.encode("hello", add_special_tokens=False)[0] != tok.bos_id


def test_hf_round_trip_and_decode(hf_folder, auto_tokenizer):
    tok, ref = load_tokenizer(hf_folder), auto_tokenizer(hf_folder)
    for text in TEXTS:
        assert_round_trip(tok, text)
        ids = ref.encode(text)
        assert tok.decode(ids) == ref.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    # merges were learnt: a frequent word is one token
    assert len(tok.encode(" tokenizer", add_special_tokens=False)) == 1


def test_hf_special_ids_and_vocab(hf_folder, auto_tokenizer):
    tok, ref = load_tokenizer(hf_folder), auto_tokenizer(hf_folder)
    assert tok.bos_token == "<|begin_of_text|>" and tok.bos_id == ref.bos_token_id == 1
    assert tok.eos_token == "<|im_end|>" and tok.eos_id == ref.eos_token_id == 3
    assert tok.eod_id == tok.eos_id
    # <|pad|> is not in tokenizer.json: appended after the vocabulary, as transformers does
    assert tok.pad_id == ref.pad_token_id == len(ref) - 1
    assert tok.vocab_size == len(ref) == 256 + len(HF_SPECIALS) + 400 + 1
    assert tok.token_to_id("<|im_start|>") == 2
    assert tok.token_to_id("no such token") is None
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [2]
    # eod_id can be overridden
    assert HFTokenizer(hf_folder / "tokenizer.json", eod_id=0).eod_id == 0


def test_hf_batch_equals_single(hf_folder):
    tok = load_tokenizer(hf_folder)
    texts = TEXTS + random_strings(50)
    for flag in (True, False):
        singles = [tok.encode(t, add_special_tokens=flag) for t in texts]
        assert tok.encode_batch(texts, add_special_tokens=flag) == singles


def test_hf_chat_template_matches_transformers(hf_folder, auto_tokenizer):
    tok, ref = load_tokenizer(hf_folder), auto_tokenizer(hf_folder)
    for gen in (True, False):
        rendered = tok.apply_chat_template(CHAT, add_generation_prompt=gen)
        assert rendered == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=gen)
    rendered = tok.apply_chat_template(CHAT)
    assert rendered.startswith("<|begin_of_text|><|im_start|>system\n") and rendered.endswith("assistant\n")
    assert tok.encode(rendered, add_special_tokens=False) == ref.encode(rendered, add_special_tokens=False)


def test_a_chat_message_that_is_not_a_dict_is_a_tokenizer_error(hf_folder):
    with pytest.raises(TokenizerError, match=r"chat message 1 is a str, not a dict: 'hi'; give each message as \{"):
        load_tokenizer(hf_folder).apply_chat_template([CHAT[0], "hi"])


def test_hf_split_special_tokens_flag(tmp_path, hf_folder, auto_tokenizer):
    folder = tmp_path / "split"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    write_json(folder / "tokenizer_config.json", {**config, "split_special_tokens": True})
    tok, ref = load_tokenizer(folder), auto_tokenizer(folder)
    text = "<|im_start|>user hi<|im_end|>"
    assert tok.encode(text) == ref.encode(text)
    assert 2 not in tok.encode(text, add_special_tokens=False)


def test_hf_post_processor_decides_bos(hf_plain_folder, auto_tokenizer):
    tok, ref = load_tokenizer(hf_plain_folder), auto_tokenizer(hf_plain_folder)
    for text in TEXTS[:8]:
        assert tok.encode(text) == ref.encode(text) == tok.encode(text, add_special_tokens=False)
    assert tok.bos_id == ref.bos_token_id == 1
    # from special_tokens_map.json
    assert tok.eos_token == "<|endoftext|>" and tok.eos_id == ref.eos_token_id == 0
    assert tok.pad_id == ref.pad_token_id == 0
    assert tok.vocab_size == len(ref)
    # from chat_template.jinja
    assert tok.apply_chat_template(CHAT) == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


# --------------------------------------------------------------------------------------------------------------
# SentencePiece (trained here)
# --------------------------------------------------------------------------------------------------------------
SPM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'system' %}{{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}"
    "{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    import io

    import sentencepiece as spm

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(make_corpus(1200, seed=3)),
        model_writer=buffer,
        model_type="bpe",
        vocab_size=700,
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    path = tmp_path_factory.mktemp("spm_model") / "tokenizer.model"
    path.write_bytes(buffer.getvalue())
    return path


def spm_folder(tmp_path_factory, model: Path, config: dict | None, name: str) -> Path:
    folder = tmp_path_factory.mktemp(name)
    (folder / "tokenizer.model").write_bytes(model.read_bytes())
    if config is not None:
        write_json(folder / "tokenizer_config.json", config)
    return folder


def llama_config(legacy: bool, **extra) -> dict:
    return {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": legacy,
        "chat_template": SPM_CHAT_TEMPLATE,
        **extra,
    }


@pytest.fixture(scope="module", params=[False, True], ids=["legacy_false", "legacy_true"])
def spm_llama_folder(request, tmp_path_factory, spm_model) -> Path:
    return spm_folder(tmp_path_factory, spm_model, llama_config(request.param), f"spm_llama_{request.param}")


def test_spm_trained_ids_match_transformers(spm_llama_folder, auto_tokenizer):
    tok, ref = load_tokenizer(spm_llama_folder), auto_tokenizer(spm_llama_folder)
    assert isinstance(tok, SentencePieceTokenizer) and tok.kind == "sentencepiece" and tok.transformers_compat
    texts = TEXTS + random_strings(500) + ["a</s>b", "<s>x", "x <s> y", "end</s>  two", "<unk>z"]
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text


def test_spm_legacy_flag_changes_text_after_special_tokens(tmp_path_factory, spm_model):
    new = load_tokenizer(spm_folder(tmp_path_factory, spm_model, llama_config(False), "spm_new"))
    old = load_tokenizer(spm_folder(tmp_path_factory, spm_model, llama_config(True), "spm_old"))
    assert new.encode("hello world") == old.encode("hello world")
    a, b = new.encode("a</s>hello", False), old.encode("a</s>hello", False)
    cut = a.index(2) + 1
    assert a != b and a[:cut] == b[:cut] and b.index(2) + 1 == cut
    assert new.decode(a[cut:]) == "hello" and old.decode(b[cut:]) == "hello"  # the legacy one starts with "▁"
    assert old.id_to_token(b[cut]).startswith("▁") and not new.id_to_token(a[cut]).startswith("▁")


def test_spm_trained_round_trip_and_byte_fallback(spm_llama_folder, auto_tokenizer):
    tok, ref = load_tokenizer(spm_llama_folder), auto_tokenizer(spm_llama_folder)
    for text in TEXTS:
        expected = text.replace("▁", " ")  # SentencePiece's own whitespace symbol decodes to a space
        if expected[:1] == " ":  # no dummy prefix is added to these: the first space is lost (as in transformers)
            expected = expected[1:]
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == expected, text
        ids = ref.encode(text)
        assert tok.decode(ids) == ref.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    assert_round_trip(tok, MIXED)
    # 🚀 and é never occur in the training corpus: byte fallback gives their UTF-8 bytes
    rocket = tok.encode("🚀", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in rocket] == ["▁", "<0xF0>", "<0x9F>", "<0x9A>", "<0x80>"]
    assert tok.decode(rocket) == "🚀"


def test_spm_special_ids_batch_vocab(spm_llama_folder, auto_tokenizer):
    tok, ref = load_tokenizer(spm_llama_folder), auto_tokenizer(spm_llama_folder)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.eod_id) == (1, 2, None, 2)
    assert (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id) == (1, 2, None)
    assert tok.token_to_id("<unk>") == 0 and tok.token_to_id("no such piece") is None
    assert tok.vocab_size == len(ref) == 700
    assert tok.encode("hi")[0] == 1 and tok.encode("hi")[-1] != 2
    texts = TEXTS + random_strings(30)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, add_special_tokens=False) == [tok.encode(t, False) for t in texts]


def test_spm_chat_template_matches_transformers(spm_llama_folder, auto_tokenizer):
    tok, ref = load_tokenizer(spm_llama_folder), auto_tokenizer(spm_llama_folder)
    rendered = tok.apply_chat_template(CHAT)
    assert rendered == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert "</s><s>[INST]" in rendered
    assert tok.encode(rendered, add_special_tokens=False) == ref.encode(rendered, add_special_tokens=False)


def test_spm_add_eos_and_pad_from_config(tmp_path_factory, spm_model, auto_tokenizer):
    config = llama_config(False, add_eos_token=True, pad_token="<pad>")
    folder = spm_folder(tmp_path_factory, spm_model, config, "spm_eos")
    tok, ref = load_tokenizer(folder), auto_tokenizer(folder)
    ids = tok.encode("hello world")
    assert ids == ref.encode("hello world") and ids[0] == 1 and ids[-1] == 2
    # <pad> is not a piece of the model: like transformers, it gets the next id
    assert tok.pad_id == ref.pad_token_id == 700 and tok.vocab_size == len(ref) == 701
    assert tok.encode("a<pad>b", add_special_tokens=False) == ref.encode("a<pad>b", add_special_tokens=False)
    assert tok.decode(tok.encode("a<pad>b"), skip_special_tokens=True) == "ab"


def test_spm_without_tokenizer_class_is_sentencepiece(tmp_path_factory, spm_model, auto_tokenizer):
    """No tokenizer_class: transformers' generic converter follows SentencePiece, and so does the adapter."""
    import sentencepiece as spm

    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    folder = spm_folder(tmp_path_factory, spm_model, config, "spm_native")
    tok, ref = load_tokenizer(folder), auto_tokenizer(folder)
    assert not tok.transformers_compat
    raw = spm.SentencePieceProcessor(model_file=str(spm_model))
    for text in TEXTS + random_strings(300):
        assert tok.encode(text, add_special_tokens=False) == raw.encode(text), text
        assert tok.encode(text) == ref.encode(text), text
    for text in TEXTS:
        if "▁" not in text:  # SentencePiece's whitespace symbol decodes to a space
            assert_round_trip(tok, text)  # the dummy prefix makes leading spaces round-trip too


def test_spm_without_tokenizer_class_legacy_false(tmp_path_factory, spm_model, auto_tokenizer):
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "legacy": False}
    folder = spm_folder(tmp_path_factory, spm_model, config, "spm_native_new")
    tok, ref = load_tokenizer(folder), auto_tokenizer(folder)
    assert not tok.transformers_compat and not tok.legacy
    for text in TEXTS + random_strings(300) + ["a</s>b", "<s>x", "x <s> y", "end</s>  two"]:
        assert tok.encode(text) == ref.encode(text), text


def test_spm_defaults_without_config(tmp_path_factory, spm_model):
    folder = spm_folder(tmp_path_factory, spm_model, None, "spm_bare")
    tok = load_tokenizer(folder)
    assert (tok.bos_token, tok.eos_token, tok.bos_id, tok.eos_id) == ("<s>", "</s>", 1, 2)
    assert tok.encode("hi")[0] == 1 and tok.encode("hi")[-1] != 2  # BOS by default, no EOS
    assert tok.chat_template is None
    overridden = SentencePieceTokenizer(folder / "tokenizer.model", add_bos_token=False, add_eos_token=True)
    assert overridden.encode("hi") == tok.encode("hi", add_special_tokens=False) + [2]


# --------------------------------------------------------------------------------------------------------------
# The real Llama-2-style model (mistral-common), as tokenizer.model and as tokenizer.json
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama2_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama2")
    tokenizer_files_module().write_test_tokenizer(folder)
    return folder


def test_write_test_tokenizer_files(llama2_folder):
    config = json.loads((llama2_folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizer" and config["legacy"] is False
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert (llama2_folder / "tokenizer.model").stat().st_size > 400_000
    assert tokenizer_files_module().llama2_tokenizer_config() == config
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('tf', {str(TOKENIZER_FILES)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(module.spm_model_path().name, sorted({'torch', 'transformers', 'mistral_common'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tokenizer.model.v1 []"


def test_llama2_spm_matches_transformers(llama2_folder, auto_tokenizer):
    tok, ref = load_tokenizer(llama2_folder), auto_tokenizer(llama2_folder)
    assert isinstance(tok, SentencePieceTokenizer) and tok.transformers_compat
    assert tok.vocab_size == len(ref) == 32000
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.eod_id) == (1, 2, None, 2)
    assert tok.encode("Hello world") == ref.encode("Hello world") == [1, 22557, 1526]
    texts = TEXTS + random_strings(1000, seed=7) + ["a</s>  b", "<s>[INST] hi [/INST]"]
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
    assert tok.encode_batch(texts[:40]) == ref(texts[:40])["input_ids"]
    assert_round_trip(tok, MIXED)
    ids = tok.encode(MIXED)
    assert tok.decode(ids) == ref.decode(ids)


def test_llama2_runs_of_spaces_follow_transformers_not_sentencepiece(llama2_folder, auto_tokenizer):
    """transformers 5's LlamaTokenizer ranks merges by piece id; SentencePiece by score (-1e9 for "▁▁"...)."""
    import sentencepiece as spm

    tok, ref = load_tokenizer(llama2_folder), auto_tokenizer(llama2_folder)
    raw = spm.SentencePieceProcessor(model_file=str(llama2_folder / "tokenizer.model"))
    text = "Hello  world"
    assert tok.encode(text, False) == ref.encode(text, add_special_tokens=False)
    assert [tok.id_to_token(i) for i in tok.encode(text, False)] == ["▁Hello", "▁▁", "world"]
    assert raw.encode(text, out_type=str) == ["▁Hello", "▁", "▁world"]
    native = SentencePieceTokenizer(llama2_folder / "tokenizer.model", transformers_compat=False, legacy=True)
    assert native.encode(text, False) == raw.encode(text)
    assert native.encode(" Hello", False) == raw.encode(" Hello") != tok.encode(" Hello", False)


def test_llama2_chat_template_matches_transformers(llama2_folder, auto_tokenizer):
    tok, ref = load_tokenizer(llama2_folder), auto_tokenizer(llama2_folder)
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=False)
    assert rendered == ref.apply_chat_template(CHAT, tokenize=False)
    assert rendered.startswith("<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there")
    assert tok.encode(rendered, False) == ref.encode(rendered, add_special_tokens=False)
    with pytest.raises(Exception, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


@pytest.fixture(scope="module")
def llama2_json_folder(tmp_path_factory, llama2_folder) -> Path:
    """A tokenizer.json laid out like meta-llama/Llama-2-*-hf's (score-ranked merges, Prepend+Replace normalizer,
    BOS post-processor), beside the same tokenizer_config.json."""
    import sentencepiece as spm
    from tokenizers import AddedToken, decoders, normalizers, processors
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.models import BPE
    from transformers.tokenization_utils_base import generate_merges

    sp = spm.SentencePieceProcessor(model_file=str(llama2_folder / "tokenizer.model"))
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    scores = {
        sp.id_to_piece(i): sp.get_score(i)
        for i in range(n)
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
    }
    tok = RustTokenizer(
        BPE(vocab=vocab, merges=generate_merges(vocab, scores), unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )
    folder = tmp_path_factory.mktemp("llama2_json")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer.model").write_bytes((llama2_folder / "tokenizer.model").read_bytes())
    (folder / "tokenizer_config.json").write_bytes((llama2_folder / "tokenizer_config.json").read_bytes())
    return folder


def test_llama2_tokenizer_json_matches_transformers(llama2_json_folder, auto_tokenizer):
    import sentencepiece as spm
    from tokenizers import Tokenizer as RustTokenizer

    tok, ref = load_tokenizer(llama2_json_folder), auto_tokenizer(llama2_json_folder)
    assert isinstance(tok, HFTokenizer)  # tokenizer.json is preferred over tokenizer.model
    texts = TEXTS + random_strings(500, seed=11) + ["a</s>  b", "<s>x"]
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
    assert tok.apply_chat_template(CHAT) == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    # The file on its own is SentencePiece-exact; transformers' LlamaTokenizer drops its normalizer for a Metaspace
    # pre-tokenizer that adds no "▁" before a leading space, and the adapter follows transformers.
    raw_file = RustTokenizer.from_file(str(llama2_json_folder / "tokenizer.json"))
    raw_spm = spm.SentencePieceProcessor(model_file=str(llama2_json_folder / "tokenizer.model"))
    assert raw_file.encode(" Hello", add_special_tokens=False).ids == raw_spm.encode(" Hello") == [28705, 22557]
    assert tok.encode(" Hello", False) == ref.encode(" Hello", add_special_tokens=False) == [22557]
    assert load_tokenizer(llama2_json_folder / "tokenizer.model").encode(" Hello", False) == [22557]


# --------------------------------------------------------------------------------------------------------------
# tiktoken
# --------------------------------------------------------------------------------------------------------------
def learn_byte_merges(texts: list[str], pat_str: str, n_merges: int) -> list[bytes]:
    """A tiny byte-level BPE trainer: the tokens created by the ``n_merges`` most frequent pair merges."""
    import regex

    words = Counter()
    for text in texts:
        for piece in regex.findall(pat_str, text):
            words[tuple(bytes([b]) for b in piece.encode("utf-8"))] += 1
    merged: list[bytes] = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        (left, right), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        new = left + right
        merged.append(new)
        updated = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
                    out.append(new)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            updated[tuple(out)] += count
        words = updated
    return merged


def reference_bpe(text: str, ranks: dict[bytes, int], pat_str: str) -> list[int]:
    """tiktoken's algorithm in plain Python: split with the pattern, then merge the lowest-ranked pair."""
    import regex

    ids = []
    for piece in regex.findall(pat_str, text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            best = min(
                ((ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)),
                key=lambda item: (item[0] is None, item[0] if item[0] is not None else 0, item[1]),
            )
            if best[0] is None:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] for p in parts]
    return ids


TIKTOKEN_SPECIALS = {"<|endoftext|>": None, "<|im_start|>": None, "<|im_end|>": None}


@pytest.fixture(scope="module")
def tiktoken_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiktoken")
    merged = learn_byte_merges(make_corpus(400, seed=5), CL100K_PAT_STR, 300)
    tokens = [bytes([b]) for b in range(256)] + merged
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    (folder / "tiny.tiktoken").write_text("\n".join(lines) + "\n", encoding="ascii")
    n = len(tokens)
    write_json(
        folder / "tokenizer_config.json",
        {
            "added_tokens_decoder": {
                str(n + i): {"content": content, "special": True} for i, content in enumerate(TIKTOKEN_SPECIALS)
            },
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": CHATML.replace("{{ bos_token }}", ""),
        },
    )
    return folder


def tiktoken_ranks(folder: Path) -> dict[bytes, int]:
    ranks = {}
    for line in (folder / "tiny.tiktoken").read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def test_tiktoken_encode_matches_reference_bpe(tiktoken_folder):
    tok = load_tokenizer(tiktoken_folder)
    assert isinstance(tok, TiktokenTokenizer) and tok.kind == "tiktoken"
    ranks = tiktoken_ranks(tiktoken_folder)
    assert len(ranks) == 556
    for text in TEXTS + random_strings(200):
        ids = tok.encode(text)
        assert ids == reference_bpe(text, ranks, CL100K_PAT_STR), text
        assert tok.decode(ids) == text
    # merges learnt from the corpus are used
    assert len(tok.encode(" the")) == 1 and tok.encode(" the") == [ranks[b" the"]]


def test_tiktoken_special_tokens(tiktoken_folder):
    tok = load_tokenizer(tiktoken_folder)
    assert tok.vocab_size == 556 + 3
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.eod_id) == (None, 558, 556, 558)
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # no BOS named: nothing added
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 557 and ids[-1] == 558
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tok.token_to_id("<|im_end|>") == 558 and tok.token_to_id("a") == ord("a")
    assert tok.token_to_id("not a token at all") is None
    rendered = tok.apply_chat_template(CHAT[:2])
    assert rendered == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there, 你好 🙂<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tiktoken_bos_eos_and_batch(tiktoken_folder):
    tok = TiktokenTokenizer(
        tiktoken_folder / "tiny.tiktoken",
        special_tokens={"<|bos|>": 600, "<|eos|>": 601},
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        add_eos_token=True,
        config={},
    )
    assert tok.vocab_size == 602 and (tok.bos_id, tok.eos_id, tok.pad_id) == (600, 601, None)
    ids = tok.encode(MIXED)
    assert ids[0] == 600 and ids[-1] == 601 and tok.decode(ids, skip_special_tokens=True) == MIXED
    texts = TEXTS + random_strings(30)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, add_special_tokens=False) == [tok.encode(t, False) for t in texts]
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHAT)


def test_tiktoken_bad_lines_name_file_and_line(tmp_path):
    good = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    cases = {
        "two_fields": good[:2] + ["QUJD"] + good[2:],
        "base64": good[:2] + ["@@notbase64 9999"] + good[2:],
        "rank": good[:2] + ["QUJD x"] + good[2:],
        "duplicate": good[:2] + [good[0].split()[0] + " 9999"] + good[2:],
    }
    for name, lines in cases.items():
        path = tmp_path / f"{name}.tiktoken"
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=rf"{name}\.tiktoken, line 3"):
            load_tokenizer(path)
    missing = tmp_path / "missing_bytes.tiktoken"
    missing.write_text("\n".join(good[:200]) + "\n")
    with pytest.raises(ValueError, match="missing_bytes.tiktoken lacks 56 of the 256 single-byte tokens"):
        load_tokenizer(missing)
    clash = tmp_path / "clash.tiktoken"
    clash.write_text("\n".join(good) + "\n")
    with pytest.raises(ValueError, match="reuses id 5"):
        TiktokenTokenizer(clash, special_tokens={"<|x|>": 5})


# --------------------------------------------------------------------------------------------------------------
# load_tokenizer
# --------------------------------------------------------------------------------------------------------------
def test_load_tokenizer_dispatch(tmp_path, hf_folder, spm_model, tiktoken_folder):
    folder = tmp_path / "all"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    (folder / "other.model").write_bytes(spm_model.read_bytes())
    (folder / "tokenizer.model").write_bytes(spm_model.read_bytes())
    (folder / "tiny.tiktoken").write_bytes((tiktoken_folder / "tiny.tiktoken").read_bytes())
    assert load_tokenizer(folder).kind == "hf"
    assert load_tokenizer(folder).path == folder / "tokenizer.json"
    (folder / "tokenizer.json").unlink()
    assert load_tokenizer(folder).kind == "sentencepiece"
    assert load_tokenizer(folder).path == folder / "tokenizer.model"
    (folder / "tokenizer.model").unlink()
    assert load_tokenizer(folder).path == folder / "other.model"
    (folder / "other.model").unlink()
    assert load_tokenizer(folder).kind == "tiktoken"
    # files, by suffix
    assert load_tokenizer(hf_folder / "tokenizer.json").kind == "hf"
    assert load_tokenizer(spm_model).kind == "sentencepiece"
    assert load_tokenizer(str(tiktoken_folder / "tiny.tiktoken")).kind == "tiktoken"
    # a .model holding a tiktoken rank file (Meta's Llama-3 layout)
    (folder / "tokenizer.model").write_bytes((tiktoken_folder / "tiny.tiktoken").read_bytes())
    assert load_tokenizer(folder / "tokenizer.model").kind == "tiktoken"
    # the config beside a file is read
    tok = load_tokenizer(hf_folder / "tokenizer.json")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template == CHATML


def test_load_tokenizer_errors(tmp_path, hf_folder):
    empty = tmp_path / "empty_ckpt"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="empty_ckpt") as err:
        load_tokenizer(empty)
    assert "tokenizer.json" in str(err.value) and ".model" in str(err.value) and ".tiktoken" in str(err.value)
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(tmp_path / "nope")

    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    with pytest.raises(ValueError, match=r"bad_json/tokenizer\.json"):
        load_tokenizer(bad_json)
    (bad_json / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(ValueError, match=r"bad_json/tokenizer\.json"):
        load_tokenizer(bad_json)

    bad_model = tmp_path / "bad_model"
    bad_model.mkdir()
    (bad_model / "tokenizer.model").write_bytes(b"\x0a\x05garbage-not-a-sentencepiece-model\xff\x00")
    with pytest.raises(ValueError, match=r"bad_model/tokenizer\.model"):
        load_tokenizer(bad_model)

    bad_config = tmp_path / "bad_config"
    bad_config.mkdir()
    (bad_config / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    (bad_config / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad_config/tokenizer_config\.json"):
        load_tokenizer(bad_config)

    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"cannot tell the tokenizer format of .*vocab\.txt"):
        load_tokenizer(tmp_path / "vocab.txt")

    no_template = tmp_path / "no_template"
    no_template.mkdir()
    (no_template / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match=r"no_template/tokenizer\.json has no chat template"):
        load_tokenizer(no_template).apply_chat_template(CHAT)


def test_module_imports_only_stdlib():
    """Importing pai_zoo.tokenizers (every module of the package) pulls in no third-party module."""
    modules = sorted(p.stem for p in (REPO / "pai_zoo" / "tokenizers").glob("*.py") if p.stem != "__init__")
    assert {"base", "chat", "config", "hf", "loader", "names", "sentencepiece", "tiktoken"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module('pai_zoo.tokenizers.' + name)\n"
        "heavy = {'torch', 'transformers', 'megatron', 'tokenizers', 'sentencepiece', 'tiktoken', 'jinja2', 'numpy',\n"
        "         'google'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert importlib.util.find_spec("pai_zoo.tokenizer") is None  # no module left behind at the old path
