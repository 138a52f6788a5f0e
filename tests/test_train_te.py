"""``transformer_impl``: a local-spec checkpoint carries Transformer Engine's tensor names (megatron-core maps the
local norms onto TE's fused norm-linear names), and a TE-named checkpoint, ``_extra_state`` entries included, loads
into a local model on the CPU; families with modules of their own keep to the local spec."""
from __future__ import annotations

import io

import pytest
import torch

from pai_zoo.formats.megatron_legacy import TE_NAMES

ODD = dict(vocab_size=300, num_hidden_layers=2, hidden_size=72, num_attention_heads=6, num_key_value_heads=2,
           head_dim=16, intermediate_size=160)


def _model(seed: int):
    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel

    family, values = get_registry().preset("llama3-tiny")
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, {**values, **ODD})))
    ensure_model_parallel()
    torch.manual_seed(seed)
    return family, config, build_gpt_model(family, config)


def test_local_checkpoint_keys_are_transformer_engines():
    _, _, model = _model(0)
    keys = {v.key for v in model.sharded_state_dict().values()}
    local = set(model.state_dict())  # the linears' _extra_state too: TE's modules have them under the same names
    local.discard("output_layer._extra_state")  # GPTModel leaves it out of every checkpoint
    # the local layer norms, under TE's fused names; every other tensor under its own
    expected = set()
    for name in local:
        head, _, rest = name.partition(".layers.")
        if not rest:
            expected.add(name)
            continue
        rest = rest.split(".", 1)[1]
        te = {v: k for k, v in TE_NAMES.items()}.get(rest, rest)
        expected.add(f"{head}.layers.{te}")
    assert keys == expected
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in keys
    assert not any(k.startswith("decoder.layers.input_layernorm") for k in keys)


def test_a_te_named_checkpoint_with_extra_state_loads_into_the_local_model(tmp_path):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from pai_zoo.mcore.dist_ckpt import load_model_weights

    _, _, saved = _model(1)
    state = saved.sharded_state_dict()
    extra = [k for k, v in state.items() if k.endswith("._extra_state") and isinstance(v, ShardedObject)]
    assert len(extra) == 4 * ODD["num_hidden_layers"], extra
    for name in extra:  # what TE's modules keep there: their FP8 metadata, serialised
        state[name].data = io.BytesIO(b"te fp8 metadata")
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    dist_checkpointing.save(state, str(folder))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    _, _, loaded = _model(2)
    before = {k: v.clone() for k, v in loaded.state_dict().items() if torch.is_tensor(v)}
    load_model_weights(loaded, folder)
    want = saved.state_dict()
    changed = 0
    for name, value in loaded.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, want[name]), name
            changed += not torch.equal(value, before[name])
    assert changed > 0  # the load replaced the second model's own initialisation


def test_a_family_with_its_own_modules_keeps_to_the_local_spec():
    from pai_zoo import PaiZooError
    from pai_zoo.families.registry import get_registry
    from pai_zoo.mcore.specs import layer_spec_for

    reg = get_registry()
    own = [f for f in reg.families.values() if f.layer_spec is not None or f.model_class is not None]
    assert own, "no family with modules of its own is installed"
    for family in own:
        assert family.backends == ("local",), family.name
        with pytest.raises(PaiZooError, match="supports transformer_impl local, not transformer_engine"):
            layer_spec_for(family, None, "transformer_engine")
    llama = reg.family("llama")
    assert llama.backends == ("local", "transformer_engine")
    _, config, _ = _model(0)
    with pytest.raises(PaiZooError, match="ALiBi is a pai-zoo attention bias of the local spec"):
        layer_spec_for(llama, {**config.arch, "position_embedding_type": "alibi"}, "transformer_engine")
