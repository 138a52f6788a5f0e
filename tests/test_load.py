"""pai_zoo.load: presets, families and checkpoint folders in both backends, and bad input."""
import json

import pytest
import torch

import pai_zoo
from pai_zoo.plugin.errors import MappingError, PaiZooError, UnknownModelError


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """llama3-tiny saved by transformers, sharded so that the index file is exercised."""
    folder = tmp_path_factory.mktemp("llama3-tiny-hf")
    handle = pai_zoo.load("llama3-tiny", backend="hf", seed=3)
    handle.model.save_pretrained(folder, max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder, handle


def test_preset_in_both_backends():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig
    from transformers import LlamaForCausalLM

    mcore = pai_zoo.load("llama3-tiny", backend="mcore")
    hf = pai_zoo.load("llama3-tiny", backend="hf")
    assert isinstance(mcore.model, GPTModel) and isinstance(mcore.config, TransformerConfig)
    assert isinstance(hf.model, LlamaForCausalLM) and hf.config.model_type == "llama"
    assert mcore.family.name == hf.family.name == "llama"
    ids = torch.tensor([[1, 5, 9, 999]])
    # The mcore model has a padded vocabulary (1024); logits are trimmed to the real one.
    assert mcore.model.embedding.word_embeddings.weight.shape[0] == 1024
    assert mcore.logits(ids).shape == hf.logits(ids).shape == (1, 4, 1000)


def test_checkpoint_folder_loads_into_mcore_with_equal_logits(hf_checkpoint):
    folder, reference = hf_checkpoint
    mcore = pai_zoo.load(folder, backend="mcore")
    by_family = pai_zoo.load("llama", checkpoint=folder)
    hf_again = pai_zoo.load(folder, backend="hf")
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    expected = reference.logits(ids)
    for handle in (mcore, by_family, hf_again):
        got = handle.logits(ids)
        assert (got - expected).abs().max().item() <= 1e-4
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert mcore.checkpoint == folder


def test_left_padded_batch_agrees_between_backends(hf_checkpoint):
    folder, reference = hf_checkpoint
    mcore = pai_zoo.load(folder, backend="mcore")
    ids = torch.tensor([[0, 0, 0, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    got, expected = mcore.logits(ids, mask), reference.logits(ids, mask)
    assert (got[0, 3:] - expected[0, 3:]).abs().max() <= 1e-4 and (got[1] - expected[1]).abs().max() <= 1e-4
    # A padded row gives the same logits as the same tokens unpadded.
    alone = mcore.logits(torch.tensor([[7, 8, 9, 10]]))
    assert (got[0, 3:] - alone[0]).abs().max() <= 1e-4


def test_hf_state_dict_of_mcore_handle_round_trips(hf_checkpoint):
    folder, reference = hf_checkpoint
    state = pai_zoo.load(folder, backend="mcore").hf_state_dict()
    original = reference.model.state_dict()
    assert state.keys() == original.keys()
    assert all(torch.equal(state[k], original[k]) for k in original)


def test_overrides_change_the_config():
    handle = pai_zoo.load("llama3-tiny", backend="mcore", num_hidden_layers=3)
    assert len(handle.model.decoder.layers) == 3 and handle.hf_config.num_hidden_layers == 3


def test_seed_makes_random_weights_reproducible():
    a = pai_zoo.load("llama3-tiny", backend="mcore", seed=5).hf_state_dict()
    b = pai_zoo.load("llama3-tiny", backend="mcore", seed=5).hf_state_dict()
    c = pai_zoo.load("llama3-tiny", backend="mcore", seed=6).hf_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_unknown_names_and_backends(tmp_path):
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-17'.*llama3-tiny"):
        pai_zoo.load("gpt-17")
    with pytest.raises(PaiZooError, match="backend='jax': use one of mcore, hf"):
        pai_zoo.load("llama3-tiny", backend="jax")
    with pytest.raises(UnknownModelError, match="no config.json"):
        pai_zoo.load("llama", checkpoint=tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(UnknownModelError, match=r"config.json: no installed family handles.*BertModel"):
        pai_zoo.load(tmp_path)


def test_corrupt_config_names_file_and_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "model_type": "llama",\n  oops\n}')
    with pytest.raises(PaiZooError, match=r"config.json: invalid JSON at line 3"):
        pai_zoo.load(tmp_path)


def test_checkpoint_missing_a_tensor_names_it(tmp_path, hf_checkpoint):
    from safetensors.torch import load_file, save_file

    folder, _ = hf_checkpoint
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(MappingError, match=r"missing source tensors: model.layers.1.mlp.up_proj.weight"):
        pai_zoo.load(tmp_path, backend="mcore")
