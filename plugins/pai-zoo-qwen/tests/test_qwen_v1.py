"""Qwen (v1): the plugin's reference QWenLMHeadModel (generate with left padding, long-context extensions) and
the qwen.tiktoken tokenizer read from a folder laid out like Qwen/Qwen-7B's."""
import json

import pytest
import torch

import pai_zoo
from pai_zoo.registry import get_registry
from pai_zoo.tokenizers import TiktokenTokenizer, read_tiktoken_ranks
from pai_zoo.tokenizers.names import family_tokenizer
from pai_zoo_conformance import checks
from pai_zoo_qwen.tokenizer_files import QWEN_SPECIAL_TOKENS, write_qwen_tiktoken_tokenizer

QWEN = get_registry().family("qwen")


@pytest.fixture(scope="module")
def case():
    return checks.build_case(QWEN)


def test_generate_with_left_padding_equals_each_prompt_alone(case):
    model = case.hf_model
    prompts = [[5, 17, 99, 3, 250, 7, 8], [42, 11, 600]]
    alone = [model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
             for p in prompts]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, width:]
    assert batch.tolist() == alone
    assert len(set(map(tuple, alone))) == 2  # the prompts lead to different continuations


def _logits(model, n):
    ids = torch.arange(n).unsqueeze(0) * 13 % 1000
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_long_context_extensions_act_only_beyond_seq_length():
    """use_dynamic_ntk / use_logn_attn change nothing within seq_length tokens (where the megatron-core model is
    the same model) and do change the logits beyond it (megatron-core has neither: see README)."""
    from pai_zoo import hf

    models = {}
    for flags in (True, False):
        config = hf.hf_config(QWEN, {**QWEN.presets["qwen-v1-tiny"], "seq_length": 8,
                                     "use_dynamic_ntk": flags, "use_logn_attn": flags})
        torch.manual_seed(0)
        models[flags] = hf.build_hf_model(QWEN, config)
    models[False].load_state_dict(models[True].state_dict())
    assert torch.equal(_logits(models[True], 8), _logits(models[False], 8))
    assert (_logits(models[True], 12) - _logits(models[False], 12)).abs().max() > 1e-4


@pytest.fixture(scope="module")
def qwen7b_style_folder(tmp_path_factory):
    """qwen.tiktoken and a tokenizer_config.json like Qwen/Qwen-7B's (remote-code tokenizer; no tokenizer.json)."""
    folder = tmp_path_factory.mktemp("qwen-v1-tokenizer")
    write_qwen_tiktoken_tokenizer(folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "model_max_length": 8192, "tokenizer_class": "QWenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_qwen.QWenTokenizer", None]}}))
    return folder


def test_tiktoken_folder_reads_like_qwen_tokenizer(qwen7b_style_folder):
    tok = family_tokenizer(QWEN, qwen7b_style_folder)
    assert isinstance(tok, TiktokenTokenizer)
    first = len(read_tiktoken_ranks(qwen7b_style_folder / "qwen.tiktoken"))
    for i, special in enumerate(QWEN_SPECIAL_TOKENS):
        assert tok.token_to_id(special) == first + i
    assert tok.vocab_size == first + 208 and tok.bos_id is None and tok.eos_id == tok.eod_id == first
    ids = tok.encode("<|im_start|>user\n2024 你好<|im_end|>")
    assert ids[0] == first + 1 and ids[-1] == first + 2
    digits = tok.encode("2024", add_special_tokens=False)
    assert [tok.decode([i]) for i in digits] == ["2", "0", "2", "4"]  # Qwen's pattern: one digit per piece
    text = "Hello, world! 通义千问 12345 🙂\n\n  end"
    assert tok.decode(tok.encode(text)) == text


def test_tiktoken_matches_transformers_on_digits_and_specials(tmp_path):
    """The conformance check's text has no digits and no special tokens; these are where Qwen's pattern and
    special-token handling differ from defaults."""
    from transformers import AutoTokenizer

    write_qwen_tiktoken_tokenizer(tmp_path)
    ours = family_tokenizer(QWEN, tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for text in ("Version 2.5 released 20240101, 3.14159", "<|im_start|>system\nhi<|im_end|><|extra_7|>",
                 "it's they'll WE'RE 1x2"):
        assert ours.encode(text) == theirs(text)["input_ids"], text


def test_checkpoint_folder_loads_as_qwen_v1(case, qwen7b_style_folder, tmp_path):
    case.hf_model.save_pretrained(tmp_path)
    for name in ("qwen.tiktoken", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((qwen7b_style_folder / name).read_bytes())
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["QWenLMHeadModel"]
    handle = pai_zoo.load(tmp_path, backend="mcore")
    assert handle.family.name == "qwen" and isinstance(handle.tokenizer, TiktokenTokenizer)
    ids = torch.tensor([[1, 20, 300, 999, 4]])
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids).logits
    assert (handle.logits(ids) - expected).abs().max() <= checks.LOGITS_ATOL
