"""Tests of pai_zoo.data.sft: SFT records, loss masks from chat templates, packing and padding.

Tokenizers are built here (no network): a byte-level BPE tokenizer.json trained with ``tokenizers`` (ChatML
template), the real Llama-2 SentencePiece model from ``write_test_tokenizer`` (Llama-2-chat template) and a small
tiktoken rank file. Masks are checked by decoding the runs of equal mask values and comparing them with text written
out by hand from the conversation.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.data import sft
from pai_zoo.data.sft import DEFAULT_CHAT_TEMPLATE, PackStats, build_example, normalize_record, pack, pad_to_multiple
from pai_zoo.tokenizers import load_tokenizer

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = REPO / "plugins" / "pai-zoo-llama" / "pai_zoo_llama" / "tokenizer_files.py"
WHERE = "data.jsonl:17"

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]

# Multi-turn, with text that tokenizers like to merge (spaces, newlines, CJK, emoji) next to the boundaries.
CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there, 你好 🙂"},
    {"role": "assistant", "content": "Hello!  How can I help?\n\nAsk away."},
    {"role": "user", "content": "Tell me  a joke."},
    {"role": "assistant", "content": "🙂 the quick brown fox, 你好."},
]
S, U1, A1, U2, A2 = (m["content"] for m in CONV)


def chatml_runs(bos: str) -> list[tuple[int, str]]:
    """Expected (mask, text) runs of CONV under a ChatML template."""
    return [
        (0, f"{bos}<|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\n{U1}<|im_end|>\n<|im_start|>assistant\n"),
        (1, f"{A1}<|im_end|>\n"),
        (0, f"<|im_start|>user\n{U2}<|im_end|>\n<|im_start|>assistant\n"),
        (1, f"{A2}<|im_end|>\n"),
    ]


LLAMA2_RUNS = [
    (0, f"<s>[INST] <<SYS>>\n{S}\n<</SYS>>\n\n{U1} [/INST]"),
    (1, f" {A1} </s>"),
    (0, f"<s>[INST] {U2} [/INST]"),
    (1, f" {A2} </s>"),
]


# --------------------------------------------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------------------------------------------
def corpus(n: int = 600, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ("the quick brown fox jumps over lazy dog hello how can help you are terse tell me joke ask away "
             "assistant user system model token data").split()
    lines = []
    for _ in range(n):
        parts = [rng.choice(words) for _ in range(rng.randint(3, 10))]
        if rng.random() < 0.3:
            parts.append(rng.choice(["你好", "🙂", "!", "?", ",", "."]))
        lines.append(rng.choice([" ", "  ", "\n"]).join(parts))
    return lines


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    """Byte-level BPE tokenizer.json whose post-processor adds BOS; ChatML template with ``{{ bos_token }}``."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(SPECIALS) + 300, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|>:0 $A:0", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]
    )
    folder = tmp_path_factory.mktemp("hf")
    tok.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHATML,
    })
    loaded = load_tokenizer(folder)
    assert loaded.kind == "hf" and loaded.encode("x")[0] == loaded.bos_id  # BOS from the post-processor
    return loaded


@pytest.fixture(scope="module")
def hf_no_template(hf_tok, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_plain")
    (folder / "tokenizer.json").write_bytes(hf_tok.path.read_bytes())
    write_json(folder / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"})
    loaded = load_tokenizer(folder)
    assert loaded.chat_template is None
    return loaded


@pytest.fixture(scope="module")
def llama_tok(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("_pai_zoo_llama_tokenizer_files", TOKENIZER_FILES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("llama")
    module.write_test_tokenizer(folder)
    loaded = load_tokenizer(folder)
    assert loaded.kind == "sentencepiece" and loaded.chat_template == module.LLAMA2_CHAT_TEMPLATE
    return loaded


@pytest.fixture(scope="module")
def tiktoken_tok(tmp_path_factory):
    """256 byte tokens + a few merges; ChatML specials; no BOS; EOS appended by the tokenizer."""
    from pai_zoo.tokenizers import TiktokenTokenizer

    merges = [b" t", b"he", b" the", b"in", b"ing", b" q", b"ui", b" qui", b"ck", b" quick", b"\n\n"]
    tokens = [bytes([b]) for b in range(256)] + merges
    folder = tmp_path_factory.mktemp("tiktoken")
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    (folder / "tiny.tiktoken").write_text("\n".join(lines) + "\n", encoding="ascii")
    n = len(tokens)
    specials = {"<|endoftext|>": n, "<|im_start|>": n + 1, "<|im_end|>": n + 2}
    return TiktokenTokenizer(
        folder / "tiny.tiktoken", special_tokens=specials, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        add_eos_token=True, config={},
    )


def runs(tok, ids, mask) -> list[tuple[int, str]]:
    """(mask value, decoded text) of each maximal run of equal mask values."""
    out: list[tuple[int, list[int]]] = []
    for token, flag in zip(ids, mask):
        if not out or out[-1][0] != flag:
            out.append((flag, []))
        out[-1][1].append(token)
    return [(flag, tok.decode(group)) for flag, group in out]


def assert_runs(tok, ids, mask, expected, strip_space: bool = False) -> None:
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    got = runs(tok, ids, mask)
    if strip_space:  # SentencePiece decoding drops the leading space of a text
        got = [(flag, text.lstrip(" ")) for flag, text in got]
        expected = [(flag, text.lstrip(" ")) for flag, text in expected]
    assert got == expected


# --------------------------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------------------------
def test_normalize_messages_record():
    record = {"id": 3, "messages": [{"role": "system", "content": "s", "name": "x"}, *CONV[1:]]}
    messages = normalize_record(record, WHERE)
    assert messages == [{"role": "system", "content": "s"}, *CONV[1:]]
    assert all(set(m) == {"role", "content"} for m in messages)
    assert messages[1] is not record["messages"][1]  # copies


def test_normalize_alpaca_record():
    assert normalize_record({"instruction": "Sum", "input": "1 2", "output": "3"}, WHERE) == [
        {"role": "user", "content": "Sum\n\n1 2"},
        {"role": "assistant", "content": "3"},
    ]
    expected = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]
    for extra in ({}, {"input": ""}, {"input": None}, {"input": "  "}):
        assert normalize_record({"instruction": "Say hi", "output": "hi", **extra}, WHERE) == expected


BAD_RECORDS = {
    "not_object": (["messages"], "must be a JSON object"),
    "no_known_keys": ({"text": "hello"}, "not an SFT record"),
    "both_formats": ({"messages": CONV, "instruction": "x", "output": "y"}, "both"),
    "messages_not_list": ({"messages": "hi"}, "'messages' must be a list"),
    "messages_empty": ({"messages": []}, "'messages' is empty"),
    "message_not_object": ({"messages": ["hi", CONV[2]]}, r"messages\[0\] must be an object"),
    "no_role": ({"messages": [{"content": "hi"}, CONV[2]]}, r"messages\[0\] has no 'role'"),
    "no_content": ({"messages": [{"role": "user"}, CONV[2]]}, r"messages\[0\] has no 'content'"),
    "unknown_role": ({"messages": [{"role": "tool", "content": "x"}, CONV[2]]}, "unknown role 'tool'"),
    "content_not_str": ({"messages": [{"role": "user", "content": ["x"]}, CONV[2]]}, "must be a string, got list"),
    "content_empty": (
        {"messages": [CONV[1], {"role": "assistant", "content": " \n"}]},
        r"messages\[1\]\.content is empty",
    ),
    "no_assistant": ({"messages": CONV[:2]}, "no assistant message"),
    "alpaca_no_output": ({"instruction": "x"}, "no 'output'"),
    "alpaca_no_instruction": ({"output": "x"}, "no 'instruction'"),
    "alpaca_instruction_type": ({"instruction": 3, "output": "x"}, "'instruction' must be a string, got int"),
    "alpaca_input_type": ({"instruction": "x", "input": 3, "output": "y"}, "'input' must be a string"),
    "alpaca_output_empty": ({"instruction": "x", "output": ""}, "'output' is empty"),
}


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_normalize_bad_records_name_location(name):
    record, pattern = BAD_RECORDS[name]
    with pytest.raises(ValueError, match=pattern) as err:
        normalize_record(record, WHERE)
    assert str(err.value).startswith(WHERE + ": ")


# --------------------------------------------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------------------------------------------
def test_hf_chatml_masks(hf_tok):
    ids, mask = build_example(CONV, hf_tok)
    rendered = hf_tok.apply_chat_template(CONV, add_generation_prompt=False)
    assert rendered.startswith("<|begin_of_text|>")  # template has BOS: no second one is added
    assert ids == hf_tok.encode(rendered, add_special_tokens=False)
    assert ids.count(hf_tok.bos_id) == 1
    assert_runs(hf_tok, ids, mask, chatml_runs("<|begin_of_text|>"))
    # the end-of-turn token of each assistant turn is trained on, that of the other turns is not
    im_end = hf_tok.token_to_id("<|im_end|>")
    assert [m for t, m in zip(ids, mask) if t == im_end] == [0, 0, 1, 0, 1]


def test_llama2_sentencepiece_masks(llama_tok):
    ids, mask = build_example(CONV, llama_tok)
    rendered = llama_tok.apply_chat_template(CONV, add_generation_prompt=False)
    assert rendered.startswith("<s>[INST] <<SYS>>")
    assert ids == llama_tok.encode(rendered, add_special_tokens=False)
    assert ids.count(llama_tok.bos_id) == 2 and ids[0] == llama_tok.bos_id  # one per user turn, none extra
    assert_runs(llama_tok, ids, mask, LLAMA2_RUNS, strip_space=True)
    eos = llama_tok.eos_id
    assert [m for t, m in zip(ids, mask) if t == eos] == [1, 1] and ids[-1] == eos


@pytest.mark.parametrize("kind", ["hf", "llama"])
def test_default_template_masks(kind, hf_no_template, llama_tok):
    tok = hf_no_template if kind == "hf" else llama_tok
    # the HF tokenizer has no template: the default is used; Llama gets it passed explicitly
    ids, mask = build_example(CONV, tok, chat_template=None if kind == "hf" else DEFAULT_CHAT_TEMPLATE)
    rendered = sft._with_template(tok, DEFAULT_CHAT_TEMPLATE).apply_chat_template(CONV, add_generation_prompt=False)
    assert rendered.startswith("<|im_start|>system\n")
    # no BOS text in the template: tokenized as the tokenizer does by default, BOS (not trained on) included
    assert ids == tok.encode(rendered) and ids[0] == tok.bos_id and mask[0] == 0
    bos = "<|begin_of_text|>" if kind == "hf" else "<s> "  # SentencePiece decodes the dummy prefix after <s>
    assert_runs(tok, ids, mask, chatml_runs(bos))
    assert tok.chat_template is (None if kind == "hf" else llama_tok.chat_template)  # the tokenizer is untouched


def test_tiktoken_masks_and_appended_eos(tiktoken_tok):
    tok = tiktoken_tok
    template = CHATML.replace("{{ bos_token }}", "")
    ids, mask = build_example(CONV, tok, chat_template=template)
    rendered = sft._with_template(tok, template).apply_chat_template(CONV, add_generation_prompt=False)
    assert ids == tok.encode(rendered)
    # the tokenizer appends EOS: it closes the last (assistant) turn, so it is trained on
    assert ids[-3:] == [tok.eos_id, ord("\n"), tok.eos_id] and mask[-3:] == [1, 1, 1]
    assert_runs(tok, ids, mask, chatml_runs("")[:-1] + [(1, f"{A2}<|im_end|>\n<|im_end|>")])
    # ending with a user turn: the appended EOS is prompt
    ids, mask = build_example(CONV[:4], tok, chat_template=template)
    assert ids[-1] == tok.eos_id and mask[-1] == 0


def test_multi_turn_spans_and_method(hf_tok, llama_tok):
    for tok, template, method in (
        (hf_tok, None, "segments"),
        (llama_tok, None, "segments"),
        (llama_tok, DEFAULT_CHAT_TEMPLATE, "prefixes"),  # "▁" dummy prefix on separately encoded segments
    ):
        ids, mask, used = sft._example(CONV, tok, template, {})
        assert used == method
        starts = [i for i in range(len(mask)) if mask[i] == 1 and (i == 0 or mask[i - 1] == 0)]
        assert len(starts) == 2  # one masked span per assistant turn
        masked = tok.decode([t for t, m in zip(ids, mask) if m])
        assert A1.strip() in masked and A2.strip() in masked and U1 not in masked and S not in masked
    # one turn more, one span more
    longer = CONV + [{"role": "user", "content": "Again."}, {"role": "assistant", "content": "Done."}]
    ids, mask = build_example(longer, hf_tok)
    assert runs(hf_tok, ids, mask)[-2:] == [
        (0, "<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"), (1, "Done.<|im_end|>\n")
    ]
    assert sum(1 for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])) == 3


def test_alpaca_record_end_to_end(hf_tok, llama_tok):
    messages = normalize_record({"instruction": "Add", "input": "2 and 3", "output": "5"}, WHERE)
    ids, mask = build_example(messages, hf_tok)
    assert runs(hf_tok, ids, mask) == [
        (0, "<|begin_of_text|><|im_start|>user\nAdd\n\n2 and 3<|im_end|>\n<|im_start|>assistant\n"),
        (1, "5<|im_end|>\n"),
    ]
    ids, mask = build_example(messages, llama_tok)
    assert runs(llama_tok, ids, mask) == [(0, "<s>[INST] Add\n\n2 and 3 [/INST]"), (1, "5 </s>")]


def test_tokens_straddling_a_boundary_are_trained_on(hf_tok):
    # No separators: " quick" and " fox" are single tokens of the trained vocabulary that straddle the cuts.
    template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
        "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    assert len(hf_tok.encode(" quick", add_special_tokens=False)) == 1
    assert len(hf_tok.encode(" fox", add_special_tokens=False)) == 1
    conv = [
        {"role": "user", "content": "the q"},
        {"role": "assistant", "content": "uick brown f"},
        {"role": "user", "content": "ox jumps"},
    ]
    ids, mask, method = sft._example(conv, hf_tok, template, {})
    assert method == "prefixes"
    assert ids == hf_tok.encode("the quick brown fox jumps")  # BOS from the post-processor, then the text
    pieces = [hf_tok.decode([t]) for t in ids]
    assert runs(hf_tok, ids, mask) == [(0, "<|begin_of_text|>the"), (1, " quick brown fox"), (0, " jumps")]
    assert pieces[1:] == ["the", " quick", " brown", " fox", " jumps"]


def test_template_errors(hf_tok, llama_tok):
    # the rendering of a prefix is not a prefix of the whole rendering
    counting = DEFAULT_CHAT_TEMPLATE + "{{ messages | length }}"
    with pytest.raises(ValueError, match="chat template problem: rendering the first 1 of 3 messages"):
        build_example(CONV[1:4], hf_tok, chat_template=counting)
    # the template raises (Llama-2-chat wants alternating roles)
    with pytest.raises(ValueError, match="chat template failed.*alternate"):
        build_example([CONV[1], CONV[1], CONV[2]], llama_tok)
    # an assistant turn the template renders as nothing
    silent = "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="renders as nothing"):
        build_example(CONV[1:3], hf_tok, chat_template=silent)
    with pytest.raises(ValueError, match="no assistant turn"):
        build_example(CONV[:2], hf_tok)
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        build_example(CONV[2:], hf_tok)


# --------------------------------------------------------------------------------------------------------------
# packing and padding
# --------------------------------------------------------------------------------------------------------------
def random_examples(n: int, seed: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(1, max_len)
        out.append(([rng.randint(3, 999) for _ in range(length)], [rng.randint(0, 1) for _ in range(length)]))
    return out


def test_pack_invariants():
    seq_length, pad_id = 64, 1
    examples = random_examples(300, seed=0, max_len=50)
    stats = PackStats()
    packs = list(pack(examples, seq_length, pad_id, stats=stats))
    tokens, masks = [], []
    for p in packs:
        assert p.tokens.shape == p.loss_mask.shape == (seq_length,)
        assert p.tokens.dtype == np.int64 and p.loss_mask.dtype == np.uint8
        assert sum(p.boundaries) == seq_length and all(b > 0 for b in p.boundaries)
        used = seq_length - p.padding
        assert (p.tokens[used:] == pad_id).all() and (p.loss_mask[used:] == 0).all()
        assert p.num_records == len(p.boundaries) - (p.padding > 0)
        tokens += p.tokens[:used].tolist()
        masks += p.loss_mask[:used].tolist()
        # record lengths inside the pack are the input lengths, in order
    assert tokens == [t for ex in examples for t in ex[0]]
    assert masks == [m for ex in examples for m in ex[1]]
    lengths = [b for p in packs for b in p.boundaries[: p.num_records]]
    assert lengths == [len(ex[0]) for ex in examples]
    # greedy: the next record did not fit in the padding of each closed pack
    first = 0
    for p in packs[:-1]:
        first += p.num_records
        assert p.padding < len(examples[first][0])
    assert stats.records == 300 and stats.packs == len(packs) and stats.truncated == 0
    assert stats.tokens == len(tokens) and stats.padding == sum(p.padding for p in packs)
    assert stats.masked_tokens == sum(masks) == sum(int(p.loss_mask.sum()) for p in packs)
    assert stats.tokens + stats.padding == seq_length * len(packs)
    # deterministic
    again = list(pack(examples, seq_length, pad_id))
    assert all((a.tokens == b.tokens).all() and a.boundaries == b.boundaries for a, b in zip(packs, again))


def test_pack_truncation_and_exact_fit():
    stats = PackStats()
    examples = [
        ([5] * 3, [0, 1, 1]),
        ([6] * 10, [1] * 10),  # longer than 8: truncated, alone in its pack
        ([7] * 8, [0] * 4 + [1] * 4),  # exactly 8: a pack with no padding
        ([8] * 2, [1, 0]),
        ([9] * 6, [0] * 6),  # 2 + 6 = 8: exact fit
        ([4], [1]),
    ]
    packs = list(pack(iter(examples), 8, 0, stats=stats))
    assert [p.boundaries for p in packs] == [[3, 5], [8], [8], [2, 6], [1, 7]]
    assert [p.padding for p in packs] == [5, 0, 0, 0, 7]
    assert packs[0].tokens.tolist() == [5, 5, 5, 0, 0, 0, 0, 0] and packs[0].loss_mask.tolist() == [0, 1, 1] + [0] * 5
    assert packs[1].tokens.tolist() == [6] * 8 and packs[1].loss_mask.tolist() == [1] * 8
    assert packs[4].tokens.tolist() == [4] + [0] * 7
    assert (stats.records, stats.packs, stats.truncated, stats.truncated_where) == (6, 5, 1, [1])
    assert (stats.tokens, stats.padding, stats.masked_tokens) == (28, 12, 2 + 8 + 4 + 1 + 1)
    assert list(pack([], 8, 0)) == []


def test_pack_with_built_examples(hf_tok):
    examples = [build_example(CONV, hf_tok), build_example(CONV[1:3], hf_tok)]
    seq_length = len(examples[0][0]) + len(examples[1][0]) + 5
    (packed,) = pack(examples, seq_length, hf_tok.pad_id)
    assert packed.boundaries == [len(examples[0][0]), len(examples[1][0]), 5]
    assert packed.tokens.tolist() == examples[0][0] + examples[1][0] + [hf_tok.pad_id] * 5
    assert packed.loss_mask.tolist() == examples[0][1] + examples[1][1] + [0] * 5


def test_pack_errors():
    with pytest.raises(ValueError, match="example 1: 3 tokens but a loss mask of 2"):
        list(pack([([1], [1]), ([1, 2, 3], [1, 1])], 8, 0))
    with pytest.raises(ValueError, match="example 0 is empty"):
        list(pack([([], [])], 8, 0))
    with pytest.raises(ValueError, match="only 0 and 1"):
        list(pack([([1, 2], [1, 2])], 8, 0))
    with pytest.raises(ValueError, match="seq_length"):
        list(pack([([1], [1])], 0, 0))
    with pytest.raises(ValueError, match="pad_id is None"):
        list(pack([([1], [1])], 8, None))


def test_pad_to_multiple():
    tokens, mask = pad_to_multiple([1, 2, 3], [0, 1, 1], 4, 9)
    assert tokens.tolist() == [1, 2, 3, 9] and mask.tolist() == [0, 1, 1, 0]
    assert tokens.dtype == np.int64 and mask.dtype == np.uint8
    tokens, mask = pad_to_multiple(list(range(8)), [1] * 8, 4, 9)  # already a multiple: unchanged
    assert tokens.tolist() == list(range(8)) and mask.tolist() == [1] * 8
    tokens, mask = pad_to_multiple([5] * 129, [1] * 129, pad_id=0)  # default multiple: 128
    assert len(tokens) == 256 and tokens[129:].tolist() == [0] * 127 and int(mask.sum()) == 129
    with pytest.raises(ValueError, match="pad_id is None"):
        pad_to_multiple([1], [1], 4)
    with pytest.raises(ValueError, match="multiple"):
        pad_to_multiple([1], [1], 0, 0)
    with pytest.raises(ValueError, match="loss mask"):
        pad_to_multiple([1, 2], [1], 4, 0)


def test_import_pulls_in_no_heavy_package():
    code = (
        "import sys\n"
        "import pai_zoo.data.sft\n"
        "heavy = {'torch', 'transformers', 'megatron'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
