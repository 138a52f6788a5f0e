"""pai-zoo's inference path for megatron-core models (pai_zoo.mcore.inference).

The reference is megatron-core's own code on the same model: its static KV cache
(``StaticInferenceContext``, with which ``CachedSelfAttention`` runs its parent's forward) and its
autograd linear layers (outside ``torch.inference_mode``)."""
import pytest
import torch
from megatron.core.inference.contexts import StaticInferenceContext
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention

from pai_zoo.families.registry import get_registry
from pai_zoo.generation import left_pad
from pai_zoo.mcore import inference
from pai_zoo.mcore.forward import decode_mask, prefill_mask
from pai_zoo.mcore.inference import (
    CachedSelfAttention,
    InferenceColumnParallelLinear,
    InferenceRowParallelLinear,
    KVCache,
    megatron_inference_mode,
    with_inference_path,
)
from pai_zoo.mcore.specs import default_layer_spec, submodules_of
from pai_zoo_conformance import checks

FAMILIES = get_registry().families

#: (family, preset, overrides): what each one exercises in the attention path.
CASES = {
    "llama: RoPE, grouped-query attention": ("llama", None, {}),
    "qwen3: q/k layer norms": ("qwen3", None, {}),
    "qwen2: qkv bias": ("qwen2", None, {}),
    "chatglm: rotary on half the channels, multi-query": ("chatglm", None, {}),
    "glm4: partial rotary, post-sublayer norms": ("glm", None, {}),
    "falcon: parallel attention + MLP": ("falcon", None, {}),
    "falcon-rw: Falcon's ALiBi core attention": (
        "falcon",
        None,
        {
            "alibi": True,
            "bias": True,
            "new_decoder_architecture": False,
            "parallel_attn": False,
            "multi_query": False,
            "num_kv_heads": 4,
        },
    ),
    "bloom: ALiBi, embedding LayerNorm": ("bloom", None, {}),
    "starcoder: learned positions, multi-query": ("starcoder", None, {}),
    "galactica: OPT position offset": ("galactica", None, {}),
}

LENGTHS = (5, 9, 1)
STEPS = 6


def _run(model, prompts, continuation, context):
    """Logits ``[steps + 1, batch, vocab]``: the prefill's last position, then one per decode step
    fed ``continuation[:, t]`` (teacher-forced, so both caches see the same tokens)."""
    ids, keep = left_pad(prompts)
    batch, length = ids.shape
    keep = torch.cat([keep, torch.ones(batch, STEPS, dtype=torch.bool)], dim=1)
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    out = []
    with torch.inference_mode(), megatron_inference_mode():  # as pai_zoo.generation runs it
        logits = model(ids, positions[:, :length], prefill_mask(keep[:, :length]), inference_context=context,
                       runtime_gather_output=True)
        out.append(logits[:, -1])
        for step in range(STEPS):
            seen = length + step + 1
            context.sequence_len_offset = seen - 1
            context.enable_decode_mode()
            logits = model(continuation[:, step:step + 1], positions[:, seen - 1:seen], decode_mask(keep)[..., :seen],
                           inference_context=context, runtime_gather_output=True)
            out.append(logits[:, -1])
    return torch.stack(out)


@pytest.mark.parametrize("name", list(CASES))
def test_kv_cache_steps_equal_megatron_static_cache(name):
    family, preset, overrides = CASES[name]
    case = checks.build_case(FAMILIES[family], preset, **overrides)
    model = case.mcore_model
    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in LENGTHS]
    continuation = torch.randint(0, vocab, (len(prompts), STEPS), generator=gen)
    total = max(LENGTHS) + STEPS
    ours = _run(model, prompts, continuation, KVCache(len(prompts), total))
    theirs = _run(model, prompts, continuation, StaticInferenceContext(len(prompts), total))
    assert torch.isfinite(ours).all()
    assert (ours - theirs).abs().max().item() < 1e-5, name


def test_every_megatron_attention_and_linear_of_a_layer_spec_is_replaced_and_nothing_else():
    spec = default_layer_spec({"normalization": "RMSNorm"})
    replaced = with_inference_path(spec)
    attention = replaced.submodules.self_attention
    assert attention.module is CachedSelfAttention
    assert attention.submodules.linear_qkv is InferenceColumnParallelLinear
    assert attention.submodules.linear_proj is InferenceRowParallelLinear
    # the MLP entry is a ModuleSpec (megatron-core 0.16) or an `MLP.as_mlp_submodule` partial (0.19)
    assert submodules_of(replaced.submodules.mlp).linear_fc1 is InferenceColumnParallelLinear
    assert submodules_of(replaced.submodules.mlp).linear_fc2 is InferenceRowParallelLinear
    assert attention.submodules.core_attention is spec.submodules.self_attention.submodules.core_attention
    assert replaced.submodules.input_layernorm is spec.submodules.input_layernorm
    # the input spec is left as it was (families build their specs once and reuse them)
    assert spec.submodules.self_attention.module is SelfAttention
    assert submodules_of(spec.submodules.mlp).linear_fc1 is ColumnParallelLinear
    assert submodules_of(spec.submodules.mlp).linear_fc2 is RowParallelLinear


def test_built_models_carry_the_inference_path_with_megatrons_state_dict():
    case = checks.build_case(FAMILIES["llama"])
    model = case.mcore_model
    assert isinstance(model.decoder.layers[0].self_attention, CachedSelfAttention)
    assert type(model.output_layer) is InferenceColumnParallelLinear
    names = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in names
    assert not any("pai_zoo" in k or "cache" in k for k in model.state_dict())


def test_full_forward_in_inference_mode_equals_megatrons_autograd_layers():
    case = checks.build_case(FAMILIES["qwen2"])  # qkv bias: the bias path of the column layer too
    model = case.mcore_model
    ids = torch.randint(0, case.mcore_config["vocab_size"], (3, 12), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(12).expand(3, 12)
    mask = torch.triu(torch.ones(12, 12, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        reference = model(ids, positions, mask)
    with torch.inference_mode():
        ours = model(ids, positions, mask)
    assert torch.equal(ours, reference)


def test_training_still_runs_megatrons_layers_with_gradients():
    case = checks.build_case(FAMILIES["llama"])
    model = case.mcore_model.train()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), 1)[None, None]
    model(ids, torch.arange(8).expand(2, 8), mask).float().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads) and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("rows", [1, 2, 8, 33])
def test_blocked_matmul_gives_the_plain_matmul(rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 96, generator=gen)
    weight = torch.randn(inference.MATMUL_BLOCK * 2 + 300, 96, generator=gen)
    expected = torch.matmul(x, weight.t())
    got = inference._matmul(x, weight)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-5


def test_kv_cache_refuses_to_write_past_its_end():
    cache = KVCache(1, 4)
    cache.sequence_len_offset = 3
    with pytest.raises(ValueError, match="KV cache of 4 positions is full"):
        cache.store(1, torch.zeros(2, 1, 1, 8), torch.zeros(2, 1, 1, 8))


def test_queries_on_left_padding_get_a_finite_attention_row():
    cache = KVCache(2, 4)
    keep = torch.tensor([[False, False, True, True], [True, True, True, True]])
    mask = cache.sdpa_mask(prefill_mask(keep), torch.float32)
    assert torch.isfinite(mask[0, 0, 0]).all()  # the first query of row 0 sees only padding: unmasked
    assert mask[0, 0, 3, :2].eq(float("-inf")).all()  # real queries never see the padding
    assert mask[1, 0, 3].eq(0).all() and mask[1, 0, 0, 1:].eq(float("-inf")).all()  # causal
    given = prefill_mask(keep)
    assert cache.sdpa_mask(given, torch.float32) is cache.sdpa_mask(given, torch.float32)  # once per forward


def test_without_a_mask_the_prefill_is_causal_and_decode_sees_the_cache():
    case = checks.build_case(FAMILIES["llama"])
    model = case.mcore_model
    ids = torch.randint(0, case.mcore_config["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7).expand(2, 7)
    causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)[None, None]
    with torch.inference_mode():
        expected = model(ids, positions, causal)  # no cache: megatron's attention with an explicit causal mask
    with torch.inference_mode(), megatron_inference_mode():  # as pai_zoo.generation runs it
        cache = KVCache(2, 9)
        prefill = model(ids[:, :6], positions[:, :6], None, inference_context=cache, runtime_gather_output=True)
        cache.sequence_len_offset = 6
        step = model(ids[:, 6:], positions[:, 6:], None, inference_context=cache, runtime_gather_output=True)
        cache.sequence_len_offset = 7
        with pytest.raises(ValueError, match="explicit attention mask"):
            model(
                torch.zeros(2, 2, dtype=torch.long),
                torch.zeros(2, 2, dtype=torch.long),
                None,
                inference_context=cache,
                runtime_gather_output=True,
            )
    assert prefill.shape[1] == 1  # megatron's static context: logits of the last position only
    assert (prefill[:, 0] - expected[:, 5]).abs().max().item() < 1e-5
    assert (step[:, 0] - expected[:, 6]).abs().max().item() < 1e-5
