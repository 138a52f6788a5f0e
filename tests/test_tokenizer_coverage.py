"""Every tokenizer kind pai-zoo reads, in every command that takes one: a folder with a ``tokenizer.json``, a
``tokenizer.json`` file, a SentencePiece ``.model``, a ``.tiktoken`` rank file with its ``tokenizer_config.json``, a
bare ``.tiktoken`` named after an OpenAI encoding (``cl100k_base``, ``o200k_base``: tiktoken's special tokens, so
``<|endoftext|>`` ends documents), any other bare ``.tiktoken`` (no special tokens: ``--append-eod`` is refused in
one line) and a test preset (``llama3-tiny``). Commands: ``preprocess`` (``--append-eod``), ``preprocess --sft``,
``dataset inspect --tokenizer``, ``eval --data FILE.jsonl --tokenizer``; ``generate``, ``convert`` and ``rl`` read a
Megatron-LM checkpoint's ``--tokenizer`` folder through :func:`pai_zoo.tokenizers.load_tokenizer`, checked here on
a folder of each kind. Also: a tokenizer the fast engine cannot load falls back quietly (a note under
``--verbose`` only), and the table of OpenAI encodings equals tiktoken's own. Nothing is downloaded.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.data.indexed import IndexedDatasetReader
from pai_zoo.testing.tokenizers import ByteLevelBPE, SentencePieceBPE, TiktokenBPE, write_json
from pai_zoo.tokenizers import load_tokenizer
from pai_zoo.tokenizers.tiktoken import CL100K_PAT_STR, OPENAI_ENCODINGS
from pai_zoo_conformance.cli_runs import main_result as run

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]

CHAT = {"messages": [{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Hello world!"}]}


def _write_ranks(path: Path, ranks: dict[bytes, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(),
                                                                                        key=lambda kv: kv[1])))
    return path


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, str]:
    """``--tokenizer`` value of every kind (folders and files written here; a preset by name)."""
    root = tmp_path_factory.mktemp("kinds")
    hf = ByteLevelBPE(config={"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>"},
                      special_tokens=["<|end|>"])(root / "hf")
    SentencePieceBPE(config={"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                             "unk_token": "<unk>", "add_bos_token": True}, repeat=10)(root / "sp")
    ranks = TiktokenBPE(pattern=CL100K_PAT_STR, config={}, tokenizer_json=False, vocab_size=300).train()
    with_config = _write_ranks(root / "tiktoken" / "tiny.tiktoken", ranks)
    write_json(with_config.parent / "tokenizer_config.json",
               {"eos_token": "<|end|>", "added_tokens_decoder": {str(len(ranks)): {"content": "<|end|>",
                                                                                   "special": True}}})
    return {"hf-folder": str(hf), "tokenizer.json": str(hf / "tokenizer.json"),
            "sentencepiece": str(root / "sp" / "tokenizer.model"), "tiktoken": str(with_config),
            "cl100k_base.tiktoken": str(_write_ranks(root / "bare1" / "cl100k_base.tiktoken", ranks)),
            "o200k_base.tiktoken": str(_write_ranks(root / "bare2" / "o200k_base.tiktoken", ranks)),
            "other.tiktoken": str(_write_ranks(root / "bare3" / "other.tiktoken", ranks)),
            "preset": "llama3-tiny"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "text.jsonl").write_text("".join(json.dumps({"text": f"Hello world {i}, it's text."}) + "\n"
                                             for i in range(3)))
    (root / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    return root




WITH_EOD = ["hf-folder", "tokenizer.json", "sentencepiece", "tiktoken", "cl100k_base.tiktoken", "o200k_base.tiktoken",
            "preset"]


@pytest.mark.parametrize("kind", WITH_EOD)
def test_preprocess_append_eod_every_kind(kind, kinds, inputs, tmp_path, capsys):
    """Each document ends with the tokenizer's end-of-document id (cl100k/o200k: tiktoken's <|endoftext|>)."""
    from pai_zoo.tokenizers.names import resolve_tokenizer

    code, out, err = run(["preprocess", "--input", inputs / "text.jsonl", "--output-prefix", tmp_path / "d",
                          "--tokenizer", kinds[kind], "--append-eod"], capsys)
    assert code == 0, err
    assert err == ""  # nothing else on stderr (no fast-engine notice without --verbose)
    tok = resolve_tokenizer(kinds[kind]).load()
    expected = {"cl100k_base.tiktoken": 100257, "o200k_base.tiktoken": 199999}.get(kind, tok.eod_id)
    assert tok.eod_id == expected is not None
    with IndexedDatasetReader(str(tmp_path / "d_text_document")) as reader:
        assert reader.num_documents == 3
        for j in range(3):
            doc = reader.document(j)
            assert int(doc[-1]) == expected and list(doc[:-1]) == [
                *tok.encode(f"Hello world {j}, it's text.")]


def test_bare_tiktoken_append_eod_is_one_line(kinds, inputs, tmp_path, capsys):
    """A rank file with no special tokens has no end-of-document id: --append-eod is refused before writing."""
    code, out, err = run(["preprocess", "--input", inputs / "text.jsonl", "--output-prefix", tmp_path / "d",
                          "--tokenizer", kinds["other.tiktoken"], "--append-eod"], capsys)
    assert code == 1 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0] == (f"pai-zoo: error: --append-eod: tokenizer {kinds['other.tiktoken']} has no end-of-document "
                        "token (no eos_token)")
    assert len(lines) == 2 and lines[1].startswith("hint: leave out --append-eod") and "cl100k_base" in lines[1]
    assert list(tmp_path.iterdir()) == []
    code, out, err = run(["preprocess", "--input", inputs / "text.jsonl", "--output-prefix", tmp_path / "d",
                          "--tokenizer", kinds["other.tiktoken"]], capsys)  # without --append-eod it works
    assert code == 0, err


@pytest.mark.parametrize("kind", [*WITH_EOD, "other.tiktoken"])
def test_preprocess_sft_every_kind(kind, kinds, inputs, tmp_path, capsys):
    code, out, err = run(["preprocess", "--sft", "--input", inputs / "chat.jsonl", "--output-prefix", tmp_path / "s",
                          "--tokenizer", kinds[kind], "--seq-length", "64"], capsys)
    if kind == "other.tiktoken":  # nothing to pad with: one line naming the flag
        assert code == 1 and err.strip() == (f"pai-zoo: error: --tokenizer {kinds[kind]}: no pad or "
                                              "end-of-document token to pad with")
        return
    assert code == 0, err
    with IndexedDatasetReader(str(tmp_path / "s_loss_mask_document")) as mask:
        assert mask.document(0).sum() > 0  # the assistant reply is trained on


@pytest.mark.parametrize("kind", ["hf-folder", "sentencepiece", "tiktoken", "o200k_base.tiktoken"])
def test_dataset_inspect_decodes_with_every_kind(kind, kinds, inputs, tmp_path, capsys):
    assert run(["preprocess", "--input", inputs / "text.jsonl", "--output-prefix", tmp_path / "d", "--tokenizer",
                kinds[kind]], capsys)[0] == 0
    code, out, err = run(["dataset", "inspect", tmp_path / "d", "--document", "1", "--tokenizer", kinds[kind]], capsys)
    assert code == 0, err
    assert "Hello world 1, it's text." in out


def test_checkpoint_folders_of_every_kind_load(kinds):
    """generate, convert and rl read a Megatron-LM checkpoint's --tokenizer folder with load_tokenizer: a folder
    holding any one kind gives that kind's adapter."""
    for kind, expected in (("hf-folder", "hf"), ("sentencepiece", "sentencepiece"), ("tiktoken", "tiktoken"),
                           ("cl100k_base.tiktoken", "tiktoken")):
        tok = load_tokenizer(Path(kinds[kind]).parent if kind != "hf-folder" else kinds[kind])
        assert tok.kind == expected and tok.decode(tok.encode("Hello world", add_special_tokens=False)) == \
            "Hello world"


@pytest.mark.parametrize("kind", ["hf-folder", "sentencepiece", "tiktoken"])
def test_eval_jsonl_with_every_kind(kind, kinds, inputs, capsys):
    """eval --data FILE.jsonl --tokenizer T tokenizes the file with T (ids inside llama3-tiny's 1000)."""
    code, out, err = run(["eval", "llama3-tiny", "--backend", "hf", "--packing", "document", "--seq-length", "8",
                          "--data", inputs / "text.jsonl", "--tokenizer", kinds[kind], "--no-progress"], capsys)
    assert code == 0, err
    assert str(inputs / "text.jsonl") in out and "perplexity" in out
    assert "preprocess" not in err


def test_eval_wrong_tokenizer_names_the_users_file(kinds, inputs, capsys):
    """A tokenizer whose ids do not fit the model: the error names the user's file and --tokenizer, never eval's
    scratch folder, and does not suggest the same tokenizer again."""
    bad = kinds["cl100k_base.tiktoken"]
    argv = ["eval", "llama3-tiny", "--backend", "hf", "--packing", "document", "--seq-length", "8",
            "--data", inputs / "text.jsonl", "--tokenizer", bad, "--no-progress"]
    code, out, err = run(argv, capsys)
    assert code == 1 and "Traceback" not in err
    if "--tokenizer-mismatch-ok" in err:  # refused before the model loads (the tokenizer's ids against its config)
        assert "pai-zoo-eval-" not in err and "_text_document" not in err
        code, out, err = run([*argv, "--tokenizer-mismatch-ok"], capsys)  # told to go on: the data's ids are checked
        assert code == 1 and "Traceback" not in err
        err = "\n".join(x for x in err.splitlines() if not x.startswith("pai-zoo: warning: "))  # the go-on note
    line = err.strip()
    assert line == (f"pai-zoo: error: --data {inputs / 'text.jsonl'}: tokenized with --tokenizer {bad} (100277 "
                    "tokens), its token ids reach 100257, outside the model's vocabulary [0, 1000): the tokenizer "
                    "does not belong to the model; leave out --tokenizer (the model's own tokenizer) or give the "
                    "folder of the model's tokenizer")
    assert "pai-zoo-eval-" not in err and "_text_document" not in err


def test_eval_tokenizer_without_eod_names_the_file(kinds, inputs, capsys):
    other = kinds["other.tiktoken"]
    code, out, err = run(["eval", "llama3-tiny", "--backend", "hf", "--packing", "document", "--seq-length", "8",
                          "--data", inputs / "text.jsonl", "--tokenizer", other, "--no-progress"], capsys)
    assert code == 1
    assert err.strip().splitlines() == [
        f"pai-zoo: error: --data {inputs / 'text.jsonl'}: the tokenizer {other} has no end-of-document token to put "
        "after each document",
        "hint: preprocess the file yourself (pai-zoo preprocess, without --append-eod) and give eval the prefix"]


# -- the fast engine's fallback is quiet -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unloadable(kinds, tmp_path_factory) -> Path:
    """A byte-level tokenizer.json gigatoken refuses ("Byte remapping failed: no single-byte vocab entry for byte
    0x00", as for SmolLM2): byte 0's symbol is missing from the vocabulary."""
    folder = tmp_path_factory.mktemp("unloadable")
    source = Path(kinds["hf-folder"])
    data = json.loads((source / "tokenizer.json").read_text())
    del data["model"]["vocab"]["\u0100"]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "tokenizer_config.json").write_text((source / "tokenizer_config.json").read_text())
    return folder


@pytest.mark.parametrize("verbose", [False, True])
def test_fast_engine_fallback_is_a_verbose_note(verbose, unloadable, inputs, tmp_path, capsys):
    argv = ["preprocess", "--input", inputs / "text.jsonl", "--output-prefix", tmp_path / "d", "--tokenizer",
            unloadable, "--append-eod"]
    code, out, err = run(["--verbose", *argv] if verbose else argv, capsys)
    assert code == 0 and "engine hf (tokenizers)" in out
    if not verbose:
        assert err == ""
    else:
        assert err.strip() == (f"pai-zoo: warning: fast engine: {unloadable / 'tokenizer.json'}: gigatoken cannot "
                               "load it: Byte remapping failed: no single-byte vocab entry for byte 0x00; the exact "
                               "engine encodes the text")


def test_eval_fallback_is_silent(unloadable, inputs, capsys):
    code, out, err = run(["eval", "llama3-tiny", "--backend", "hf", "--packing", "document", "--seq-length", "8",
                          "--data", inputs / "text.jsonl", "--tokenizer", unloadable, "--no-progress"], capsys)
    assert code == 0, err
    assert "gigatoken" not in err and "preprocess" not in err


def test_openai_encodings_are_tiktokens(monkeypatch):
    """OPENAI_ENCODINGS (split pattern, special tokens) equals tiktoken's own definitions (their rank files are
    not downloaded: the loader is replaced)."""
    from tiktoken_ext import openai_public

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})
    for name, (pattern, specials) in OPENAI_ENCODINGS.items():
        spec = getattr(openai_public, name)()
        assert (spec["pat_str"], spec["special_tokens"]) == (pattern, specials), name


def test_o200k_named_file_uses_o200k_pattern(kinds):
    """A file named o200k_base.tiktoken splits as tiktoken's o200k_base does (not cl100k's digits-in-threes)."""
    import tiktoken

    from pai_zoo.tokenizers.tiktoken import read_tiktoken_ranks

    path = kinds["o200k_base.tiktoken"]
    tok = load_tokenizer(path)
    name, (pattern, specials) = "o200k_base", OPENAI_ENCODINGS["o200k_base"]
    reference = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=read_tiktoken_ranks(path),
                                  special_tokens=specials)
    text = "Hello WORLD's 12345 <|endoftext|> tabs\t\tend"
    assert tok.encode(text) == reference.encode(text, allowed_special="all")
    assert tok.eos_token == "<|endoftext|>" and np.int64(tok.eod_id) == 199999


# -- SFT: a default system prompt only where the chat template adds it ------------------------------------------
#: Qwen2.5's template: "You are Qwen ..." when the conversation has no system message.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
#: plain ChatML: no system message of its own.
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
DEFAULT_PROMPT = "You are Qwen, created by Alibaba Cloud."


@pytest.fixture(scope="module")
def chat_tokenizers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    out = {}
    for name, template in (("qwen25", QWEN25_TEMPLATE), ("chatml", CHATML_TEMPLATE)):
        out[name] = ByteLevelBPE(config={"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                                         "pad_token": "<|endoftext|>", "chat_template": template},
                                 special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                 specials_first=False)(root / name)
    return out


@pytest.mark.parametrize("name", ["qwen25", "chatml"])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_sft_system_prompt_is_the_templates(name, system, chat_tokenizers):
    """SFT tokens are transformers' apply_chat_template(tokenize=True) ids: the default system prompt appears
    exactly when the template adds it (Qwen2.5-style, no system message given), with loss mask 0; pai-zoo adds no
    system message of its own."""
    from transformers import AutoTokenizer

    from pai_zoo.data.sft import build_example

    messages = ([{"role": "system", "content": system}] if system else []) + CHAT["messages"]
    tok = load_tokenizer(chat_tokenizers[name])
    ids, mask = build_example(messages, tok)
    reference = AutoTokenizer.from_pretrained(chat_tokenizers[name])
    assert ids == list(reference.apply_chat_template(messages, tokenize=True)["input_ids"])
    text = tok.decode(ids)
    assert text.count(DEFAULT_PROMPT) == (1 if name == "qwen25" and system is None else 0)
    assert text.count("<|im_start|>system") == (0 if name == "chatml" and system is None else 1)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "Hello world!<|im_end|>\n"  # the system prompt, default or given, is never a target


def test_preprocess_sft_keeps_the_templates_default_prompt(chat_tokenizers, inputs, tmp_path, capsys):
    for name, count in (("qwen25", 1), ("chatml", 0)):
        code, out, err = run(["preprocess", "--sft", "--no-pack", "--input", inputs / "chat.jsonl", "--output-prefix",
                              tmp_path / name, "--tokenizer", chat_tokenizers[name]], capsys)
        assert code == 0, err
        tok = load_tokenizer(chat_tokenizers[name])
        with IndexedDatasetReader(str(tmp_path / f"{name}_text_document")) as reader:
            assert tok.decode(reader.document(0).tolist()).count(DEFAULT_PROMPT) == count
