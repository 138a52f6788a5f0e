"""gpt-oss specifics the suite does not cover: the expert-tensor-parallel size of biased experts at conversion, and
config values pai-zoo cannot compute refused in one line."""
import json

import pytest

from pai_zoo import ConfigTranslationError, PaiZooError
from pai_zoo.families.registry import get_registry

GPT_OSS = get_registry().family("gpt-oss")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from pai_zoo_conformance.cases import shared_case

    folder = tmp_path_factory.mktemp("gpt-oss") / "hf"
    shared_case(GPT_OSS).hf_model.save_pretrained(folder)
    return folder


def test_tensor_parallel_conversion_keeps_the_experts_whole(hf_folder, tmp_path):
    """--tp 2 without --etp lays the biased experts out at expert-tensor-parallel size 1 (megatron-core's only
    one for biased experts); --etp 2 is refused in one line."""
    from pai_zoo.conversion import convert

    convert(hf_folder, tmp_path / "tp2", "mcore", tp=2, progress=False)
    record = json.loads((tmp_path / "tp2" / "pai_zoo.json").read_text())
    assert record["tensor_parallel"] == 2 and record["expert_tensor_parallel"] == 1
    with pytest.raises(PaiZooError, match=r"^--etp 2: .*pass --etp 1$"):
        convert(hf_folder, tmp_path / "etp2", "mcore", tp=2, etp=2, progress=False)


@pytest.mark.parametrize("change, says", [
    ({"swiglu_alpha": 1.5}, "swiglu_alpha=1.5"),
    ({"swiglu_limit": None}, "swiglu_limit=None"),
    ({"attention_bias": False}, "attention_bias=False"),
    ({"layer_types": ["chunked_attention", "full_attention"]}, "'chunked_attention'"),
])
def test_unsupported_config_refused_in_one_line(change, says):
    config = {**GPT_OSS.presets["gpt-oss-tiny"], **change}
    with pytest.raises(ConfigTranslationError) as err:
        GPT_OSS.to_mcore_config(config)
    assert says in str(err.value) and "\n" not in str(err.value)
