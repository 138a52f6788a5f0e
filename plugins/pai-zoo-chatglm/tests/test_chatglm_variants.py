"""ChatGLM variants beyond the tiny preset, a checkpoint folder laid out as THUDM publishes it, the refused
configs, and the tokenizer's ChatGLM conventions."""
import json

import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo.tokenizers.names import family_tokenizer
from pai_zoo_conformance import checks

REGISTRY = get_registry()
CHATGLM = REGISTRY.family("chatglm")

VARIANTS = {
    "multi-head (multi_query_attention=False)": {"multi_query_attention": False},
    "one key/value group (multi-query)": {"multi_query_group_num": 1},
    "all linear biases (add_bias_linear)": {"add_bias_linear": True},
    "no q/k/v bias": {"add_qkv_bias": False},
    "rope_ratio 1 (ChatGLM2, ChatGLM3 8k)": {"rope_ratio": 1},
    "rope_ratio 50 (ChatGLM3-6B-32K)": {"rope_ratio": 50},
    "kv_channels != hidden / heads": {"kv_channels": 8},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    checks.check_variant(CHATGLM, **VARIANTS[variant])


def test_rope_ratio_scales_the_rotary_base_and_matters():
    import torch

    assert CHATGLM.to_mcore_config({**CHATGLM.presets["chatglm3-6b-32k"]})["rotary_base"] == 500000.0
    case = checks.build_case(CHATGLM)  # tiny: rope_ratio 3, rotary on 8 of 16 channels
    case.mcore_model.rotary_pos_emb.inv_freq *= 3.0 ** (torch.arange(0, 8, 2) / 8)  # now base 10000, not 30000
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_published_checkpoint_folder_loads(tmp_path):
    """config.json with THUDM's keys (auto_map, architectures ChatGLMModel) and the rotary inv_freq buffer in the
    weights: the family is detected, inv_freq is dropped, logits equal the reference model's."""
    import torch
    from safetensors.torch import save_file

    import pai_zoo

    case = checks.build_case(CHATGLM)
    config = {
        **CHATGLM.presets["chatglm-tiny"],
        "auto_map": {
            "AutoConfig": "configuration_chatglm.ChatGLMConfig",
            "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration",
        },
        "torch_dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in case.hf_model.state_dict().items()}
    state["transformer.rotary_pos_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    save_file(state, tmp_path / "model.safetensors")
    handle = pai_zoo.load(tmp_path)
    assert handle.family is CHATGLM
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids).logits
    assert (handle.logits(ids) - expected).abs().max().item() <= checks.LOGITS_ATOL


@pytest.mark.parametrize("key, value", [
    ("rmsnorm", False), ("apply_residual_connection_post_layernorm", True), ("post_layer_norm", False),
    ("quantization_bit", 4), ("pre_seq_len", 128), ("tie_word_embeddings", True),
])
def test_unsupported_settings_are_refused(key, value):
    with pytest.raises(ConfigTranslationError, match=key):
        checks.build_case(CHATGLM, **{key: value})


def test_heads_must_split_into_groups():
    with pytest.raises(ConfigTranslationError, match="multi_query_group_num=3"):
        CHATGLM.to_mcore_config({**CHATGLM.presets["chatglm-tiny"], "multi_query_group_num": 3})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chatglm-tokenizer")
    CHATGLM.test_tokenizer(folder)
    return family_tokenizer(CHATGLM, folder)


def test_special_tokens_follow_the_pieces_and_every_text_starts_with_gmask_sop(tokenizer):
    from pai_zoo_chatglm.tokenizer import SPECIAL_TOKENS, ChatGLMTokenizer

    assert isinstance(tokenizer, ChatGLMTokenizer)
    pieces = tokenizer._sp.get_piece_size()
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(pieces, pieces + 9))
    ids = tokenizer.encode("hello")
    assert ids[:2] == [pieces + 1, pieces + 3]  # [gMASK], sop
    assert ids[2:] == tokenizer._sp.encode("hello")  # SentencePiece's own ids after the prefix
    assert tokenizer.eos_id == 2 and tokenizer.pad_id == 0


def test_chat_turns_encode_role_tokens_as_single_ids(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "[gMASK]sop<|user|>\n hi<|assistant|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    role = {t: tokenizer.token_to_id(t) for t in ("[gMASK]", "sop", "<|user|>", "<|assistant|>")}
    assert ids[:3] == [role["[gMASK]"], role["sop"], role["<|user|>"]] and ids[-1] == role["<|assistant|>"]


def test_tokenizer_hook_answers_only_for_chatglm(tmp_path):
    from pai_zoo_chatglm import pai_zoo_tokenizer

    assert pai_zoo_tokenizer(REGISTRY.family("llama"), tmp_path) is None
    with pytest.raises(FileNotFoundError, match="tokenizer.model"):
        pai_zoo_tokenizer(CHATGLM, tmp_path)


def test_pickled_checkpoint_with_inv_freq_converts_to_megatron_and_back(tmp_path):
    """ChatGLM2-6B ships pickled ``pytorch_model*.bin`` files holding the rotary ``inv_freq`` buffer: convert
    drops it on the way in and gives back every parameter bit-identical."""
    import torch
    from safetensors.torch import load_file

    from pai_zoo import convert

    case = checks.build_case(CHATGLM)
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CHATGLM.presets["chatglm-tiny"]))
    state = {k: v.clone() for k, v in case.hf_model.state_dict().items()}
    torch.save({**state, "transformer.rotary_pos_emb.inv_freq": torch.ones(4)}, src / "pytorch_model.bin")
    convert(src, tmp_path / "mcore", "mcore")
    convert(tmp_path / "mcore", tmp_path / "back", "hf")
    back = {}
    for file in (tmp_path / "back").glob("*.safetensors"):
        back.update(load_file(file))
    assert back.keys() == state.keys()
    assert all(back[k].equal(state[k]) for k in state)


def test_rotary_turns_interleaved_pairs_of_the_first_half_of_each_head():
    """The published convention, worked by hand: head_dim 8 -> rotary on channels 0..3 as pairs (0,1), (2,3) with
    theta = (10000 * rope_ratio) ** (-2i / 4); channels 4..7 pass through. (The forward check shows megatron's
    rotary_percent=0.5 + rotary_interleaved=True equals this reference.)"""
    import math

    import torch

    from pai_zoo_chatglm.modeling import ChatGLMConfig, RotaryEmbedding, apply_rotary

    config = ChatGLMConfig(hidden_size=8, num_attention_heads=1, kv_channels=8, rope_ratio=4)
    cos, sin = RotaryEmbedding(config)(torch.tensor([[3]]))
    x = torch.arange(1.0, 9.0).view(1, 1, 1, 8)
    out = apply_rotary(x, cos, sin).flatten().tolist()
    expected = []
    for (a, b), theta in zip(((1.0, 2.0), (3.0, 4.0)), (1.0, 40000.0 ** -0.5)):
        angle = 3 * theta
        expected += [a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle)]
    expected += [5.0, 6.0, 7.0, 8.0]
    assert out == pytest.approx(expected, abs=1e-5)
