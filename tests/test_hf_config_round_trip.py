"""HF -> mcore -> HF writes back the config.json keys the source had (or that transformers writes itself), and
no key a family's translation rules fill in (StarCoder2's mlp_type / norm_type, ChatGLM's original_rope)."""
import json

import pytest
import torch

from pai_zoo.conversion.entry import convert
from pai_zoo.families.registry import get_registry
from pai_zoo.hf import models as hf
from pai_zoo.plugin.config_map import McoreConfig

REGISTRY = get_registry()
IGNORED = {"transformers_version"}


def _saved(config) -> dict:
    """What ``save_pretrained`` writes as config.json."""
    return {k: v for k, v in json.loads(config.to_json_string(use_diff=True)).items() if k not in IGNORED}


@pytest.mark.parametrize("name", sorted(REGISTRY.families))
def test_config_transformers_writes_round_trips_unchanged(name):
    """The tiny preset reduced to the keys its config class declares, as transformers writes a new config."""
    family = REGISTRY.family(name)
    preset = dict(family.presets[family.tiny])
    declared = hf.config_class(family, preset.get("model_type") or family.default_model_type)().to_dict()
    source = hf.hf_config(family, {k: v for k, v in preset.items() if k in declared or k == "model_type"})
    mcore = McoreConfig.from_json(family.to_mcore_config(hf.config_dict(source)).to_json())
    back = hf.hf_config_from_mcore(family, mcore)
    before, after = _saved(source), _saved(back)
    assert {
        k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)
    } == {}


def test_starcoder2_folder_saved_by_transformers_converts_back_to_the_same_config_json(tmp_path):
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    config = Starcoder2Config(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                              sliding_window=6, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    Starcoder2ForCausalLM(config).save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "mcore", "mcore")
    convert(tmp_path / "mcore", tmp_path / "hf-again", "hf")
    before, after = (json.loads((tmp_path / f / "config.json").read_text()) for f in ("hf", "hf-again"))
    assert "mlp_type" not in before and "norm_type" not in before
    assert {k: v for k, v in after.items() if k not in IGNORED} == {k: v for k, v in before.items() if k not in IGNORED}
