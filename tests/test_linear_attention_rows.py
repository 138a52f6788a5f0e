"""Gated attention and Gated DeltaNet rows (pai_zoo.tables.mapping.gated_rows) and the config rule
(pai_zoo.plugin.linear_attention): bit-identical both ways, the layout transformers reads."""
import pytest
import torch

from pai_zoo.plugin.errors import ConfigTranslationError
from pai_zoo.plugin.linear_attention import LinearAttentionLayers
from pai_zoo.tables.mapping import GatedDeltaInProj, GatedQKV, MappingContext

pytestmark = pytest.mark.no_megatron

HK, HV, DK, DV, H = 2, 6, 4, 3, 5


def test_in_proj_is_transformers_ordering_and_round_trips():
    from types import SimpleNamespace

    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    qkvz = torch.randn(HK * (2 * DK + 2 * DV * HV // HK), H)
    ba = torch.randn(2 * HV, H)
    row = GatedDeltaInProj("l.{in_proj_qkvz,in_proj_ba}.weight", "m.in_proj.weight", (HK, HV, DK, DV))
    (fused,) = row.to_mcore([qkvz, ba], None)
    layer = SimpleNamespace(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)
    x = torch.randn(1, 1, H)
    q, k, v, z, b, a = Qwen3NextGatedDeltaNet.fix_query_key_value_ordering(layer, x @ qkvz.T, x @ ba.T)
    want = torch.cat([t.reshape(-1) for t in (q, k, v, z, b, a)])
    assert torch.equal((x @ fused.T).reshape(-1), want)
    back = row.to_hf([fused], None)
    assert torch.equal(back[0], qkvz) and torch.equal(back[1], ba)


def test_gated_qkv_round_trips_and_groups_gate_after_queries():
    heads, groups, d = 6, 2, 4
    ctx = MappingContext(num_layers=1, num_attention_heads=heads, num_query_groups=groups, head_dim=d, vocab_size=8,
                         padded_vocab_size=8, tied_embeddings=False)
    q, k, v = torch.randn(2 * heads * d, H), torch.randn(groups * d, H), torch.randn(groups * d, H)
    row = GatedQKV("l.{q,k,v}_proj.weight", "m.linear_qkv.weight")
    (fused,) = row.to_mcore([q, k, v], ctx)
    group0 = fused[: (2 * 3 + 2) * d]
    assert torch.equal(group0[:d], q[:d]) and torch.equal(group0[3 * d:4 * d], q[d:2 * d])  # query 0, gate 0
    assert all(torch.equal(a, b) for a, b in zip(row.to_hf([fused], ctx), (q, k, v)))


def _hf(**kw):
    base = dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=8, linear_conv_kernel_dim=4)
    base.update(kw)
    return base


@pytest.mark.parametrize("given", [{"layer_types": ["linear_attention", "full_attention"] * 2},
                                   {"full_attention_interval": 2}, {}])
def test_config_rule_round_trip(given):
    hf = _hf(**given)
    arch = {"num_layers": 4}
    LinearAttentionLayers().to_mcore(hf, arch)
    assert arch["experimental_attention_variant"] == "gated_delta_net"
    assert arch["linear_attention_freq"] == ([1, 0, 1, 0] if given else [1, 1, 1, 0])
    back = {}
    LinearAttentionLayers().to_hf(arch, back)
    assert {k: v for k, v in hf.items() if k != "num_hidden_layers"}.items() <= back.items()


def test_config_rule_refuses_bad_heads():
    with pytest.raises(ConfigTranslationError, match="linear_num_value_heads"):
        LinearAttentionLayers().to_mcore(_hf(linear_num_value_heads=5), {"num_layers": 4})


def test_megatron_lm_args_round_trip():
    from pai_zoo.plugin.linear_attention import MegatronLmGatedDeltaNet

    arch = {"num_layers": 4}
    LinearAttentionLayers().to_mcore(_hf(full_attention_interval=2), arch)
    arch["attention_output_gate"] = True
    args = {"num_layers": 4}
    MegatronLmGatedDeltaNet().to_hf(arch, args)
    back = {}
    MegatronLmGatedDeltaNet().to_mcore({**args, "linear_attention_freq": 2}, back)  # Megatron-LM's int form
    assert {k: arch[k] for k in back} == back
