"""Kimi-K2 specifics the shared suite does not reach: the folder a conversion writes keeps ``model_type: kimi_k2``
and loads without remote code, the family is told from DeepSeek-V3 by model type alone, and the tiktoken tokenizer
of the real layout (``tiktoken.model`` + remote ``tokenization_kimi.py``) is read without its code as that code
reads it."""
from __future__ import annotations

import json

import pytest
import torch

from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks
from pai_zoo_conformance.cases import shared_case

#: Text on which Kimi's split pattern and cl100k's differ (Han runs, case changes inside a word, digits).
SAMPLE = "HTTPServer的月之暗面Kimi模型 It's we're 12345 abcDEF  \n\n end"


def _kimi():
    return get_registry().family("kimi-k2")


@pytest.mark.parametrize("model_type, family", [("kimi_k2", "kimi-k2"), ("deepseek_v3", "deepseek-v3")])
def test_one_architecture_two_model_types(model_type, family):
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": model_type}
    assert get_registry().family_for_hf_config(config).name == family


def test_saved_folder_is_kimi_k2_and_loads_without_remote_code(tmp_path):
    """transformers' DeepseekV3ForCausalLM saves a Kimi-K2 folder with its checkpoint's per-expert names; pai-zoo
    reads it (family from config.json) and its logits equal transformers'."""
    import pai_zoo

    fam = _kimi()
    case = shared_case(fam)
    case.hf_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "kimi_k2" and config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert "auto_map" not in config
    from safetensors import safe_open

    with safe_open(str(next(tmp_path.glob("*.safetensors"))), "pt") as f:
        assert "model.layers.1.mlp.experts.0.gate_proj.weight" in set(f.keys())
    handle = pai_zoo.load(tmp_path)
    assert handle.family.name == "kimi-k2"
    ids = torch.arange(5, 5 + 12).unsqueeze(0)
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids).logits
    assert (handle.logits(ids).float() - expected).abs().max() < 1e-4


def _real_layout(folder, source):
    """A Kimi-K2 tokenizer folder as published: ``tiktoken.model``, a ``tokenizer_config.json`` naming the remote
    class (``auto_map``), and no ``tokenizer.json``."""
    folder.mkdir()
    (folder / "tiktoken.model").write_bytes((source / "tiktoken.model").read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="TikTokenTokenizer",
                  auto_map={"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tiktoken_tokenizer_reads_as_kimis_code_reads_it(tmp_path):
    """pai-zoo's reader of the real layout (no tokenizer.json, remote tokenizer code not run) gives the ids of a
    tiktoken Encoding built as tokenization_kimi.py builds it, and transformers' reading of the test tokenizer's
    tokenizer.json the same; Kimi's split pattern matters (cl100k's gives other ids)."""
    import tiktoken
    from transformers import AutoTokenizer

    from pai_zoo.tokenizers import CL100K_PAT_STR, read_tiktoken_ranks
    from pai_zoo.tokenizers.names import family_tokenizer
    from pai_zoo_deepseek.kimi_tokenizer import KIMI_PAT_STR, kimi_special_tokens

    fam = _kimi()
    written = tmp_path / "written"
    fam.test_tokenizer(written)
    folder = _real_layout(tmp_path / "real", written)
    ours = family_tokenizer(fam, folder)
    ranks = read_tiktoken_ranks(folder / "tiktoken.model")
    specials = kimi_special_tokens(len(ranks))
    reference = tiktoken.Encoding("kimi", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    text = SAMPLE + "<|im_user|>hi<|im_end|>[EOS]"
    expected = reference.encode(text, allowed_special="all")
    assert ours.encode(text) == expected  # no BOS added, special tokens in text are their ids
    assert AutoTokenizer.from_pretrained(written)(text)["input_ids"] == expected
    assert (ours.bos_id, ours.eos_id) == (specials["[BOS]"], specials["[EOS]"]) == (400, 401)
    assert ours.decode(ours.encode(SAMPLE)) == SAMPLE
    cl100k = tiktoken.Encoding("cl100k-like", pat_str=CL100K_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    assert cl100k.encode(SAMPLE) != reference.encode(SAMPLE)


def test_kimi_presets_translate():
    fam = _kimi()
    arch = fam.to_mcore_config(fam.presets["kimi-k2-1t"]).arch
    assert (arch["num_moe_experts"], arch["moe_router_topk"], arch["moe_router_topk_scaling_factor"]) == (384, 8, 2.827)
    assert arch["moe_layer_freq"] == [0] + [1] * 60 and "moe_router_num_groups" not in arch
    assert fam.to_hf_config_dict(fam.to_mcore_config(fam.presets["kimi-k2-tiny"]))["model_type"] == "kimi_k2"
    checks.check_forward_equivalence(shared_case(fam, fam.odd))  # YaRN from 32 positions, reached
