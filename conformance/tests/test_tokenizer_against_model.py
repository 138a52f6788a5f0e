"""The tokenizer check compares the tokenizer with the model, not only with AutoTokenizer on the same files
(issue 18): a SentencePiece tokenizer whose BOS/EOS became added tokens 500/501 and that adds no BOS passes the
AutoTokenizer comparison, and fails here."""
import dataclasses

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.testing.tokenizers import SentencePieceBPE
from pai_zoo_conformance import ConformanceFailure, ConformanceSuite, checks

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

LLAMA = get_registry().family("llama")  # tiny preset: bos_token_id 1, eos_token_id 2
CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
          "unk_token": "<unk>", "add_bos_token": True, "clean_up_tokenization_spaces": False}

#: <s> and </s> are no SentencePiece pieces: the conversion to tokenizer.json adds them after the 500 pieces
#: (ids 500, 501); nothing puts BOS first.
MOVED_IDS = SentencePieceBPE(config=CONFIG, options={"bos_id": -1, "eos_id": -1}, tokenizer_json=True)
#: the right ids (<s> = 1, </s> = 2), but the tokenizer.json adds no BOS although the config says add_bos_token.
NO_BOS = SentencePieceBPE(config=CONFIG, tokenizer_json=True)


def test_the_real_tokenizer_fits_the_model(tmp_path):
    checks.check_tokenizer_against_model(LLAMA, tmp_path)


def test_bos_eos_moved_to_added_tokens_fails(tmp_path):
    family = dataclasses.replace(LLAMA, test_tokenizer=MOVED_IDS)
    checks.check_tokenizer(family, tmp_path / "a")  # the comparison with AutoTokenizer alone passes it
    with pytest.raises(ConformanceFailure, match=r"\[tokenizer\] BOS id 500 \('<s>'\) is not the bos_token_id \[1\]"):
        checks.check_tokenizer_against_model(family, tmp_path / "b")


def test_the_suite_runs_it_on_every_family(tmp_path):
    """The suite's own test (every family runs it) fails on the broken tokenizer, and passes the real one."""
    ConformanceSuite().test_tokenizer_fits_the_model(LLAMA, tmp_path / "real")
    broken = dataclasses.replace(LLAMA, test_tokenizer=MOVED_IDS)
    with pytest.raises(ConformanceFailure, match=r"\[tokenizer\] BOS id 500 \('<s>'\) is not the bos_token_id"):
        ConformanceSuite().test_tokenizer_fits_the_model(broken, tmp_path / "broken")


def test_no_bos_on_encode_fails(tmp_path):
    family = dataclasses.replace(LLAMA, test_tokenizer=NO_BOS)
    checks.check_tokenizer(family, tmp_path / "a")
    with pytest.raises(ConformanceFailure, match=r"says add_bos_token, but encode\('a'\) starts with"):
        checks.check_tokenizer_against_model(family, tmp_path / "b")


def test_a_special_token_off_its_declared_id_fails(tmp_path):
    config = {**CONFIG, "added_tokens_decoder": {"7": {"content": "<s>", "special": True}}}
    family = dataclasses.replace(LLAMA, test_tokenizer=SentencePieceBPE(config=config))
    with pytest.raises(ConformanceFailure, match=r"special token '<s>' has id 1; tokenizer_config.json declares 7"):
        checks.check_tokenizer_against_model(family, tmp_path)
