"""A gpt-oss folder in the published MXFP4 layout, and the check that pai-zoo reads it as transformers does.

:func:`write_mxfp4_folder` lays a small gpt-oss out as transformers' MXFP4 quantizer stores one
(``Mxfp4ReverseDeserialize``: ``*_blocks`` ``[E, out, in / 32, 16]`` and ``*_scales`` ``[E, out, in / 32]``, uint8);
its quantize step needs triton kernels, so the codes and exponents are drawn at random. :func:`check_mxfp4_folder`
loads the folder with transformers' own MXFP4 loader (``Mxfp4Config(dequantize=True)``) and asserts that pai-zoo's
reader (:mod:`pai_zoo.formats.encodings.mxfp4`) hands out the same bits for every tensor and that the megatron-core
model's logits equal transformers' (fp32). Torch and transformers are imported when called.
"""
from __future__ import annotations

import json
from pathlib import Path

#: A small gpt-oss whose expert widths are multiples of 32 (MXFP4's block), both layer kinds, YaRN.
MXFP4_CONFIG = dict(
    model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=509, hidden_size=64, intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=512, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                  "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                  "original_max_position_embeddings": 128},
    rms_norm_eps=1e-5, attention_bias=True, swiglu_limit=7.0, tie_word_embeddings=False, bos_token_id=400,
    pad_token_id=401, eos_token_id=402,
)


def random_packed(shape, generator):
    """Random MXFP4 blocks ``[*shape, 16]`` and scale bytes ``[*shape]`` near 2**0 (120..132)."""
    import torch

    blocks = torch.randint(0, 256, (*shape, 16), generator=generator, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(120, 133, tuple(shape), generator=generator, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def write_mxfp4_folder(folder, seed: int = 0) -> Path:
    """A gpt-oss folder with MXFP4 experts: the other tensors bf16 from a random transformers model, every layer's
    ``mlp.experts.gate_up_proj`` and ``down_proj`` random blocks and scales; ``config.json`` with gpt-oss's
    ``quantization_config``, and the test tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    from pai_zoo.formats.encodings import mxfp4

    from .tokenizer_files import write_gpt_oss_tokenizer

    folder = Path(folder)
    torch.manual_seed(seed)
    config = GptOssConfig(**{k: v for k, v in MXFP4_CONFIG.items() if k not in ("model_type", "architectures")})
    model = GptOssForCausalLM(config).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(mxfp4.PROJECTIONS):
            experts, width, out = tensor.shape
            state[mxfp4.blocks_name(name)], state[mxfp4.scales_name(name)] = random_packed(
                (experts, out, width // mxfp4.BLOCK), gen)
        else:
            state[name] = tensor.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config_json = {**MXFP4_CONFIG, "dtype": "bfloat16", "quantization_config": dict(mxfp4.DEFAULT_CONFIG)}
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    write_gpt_oss_tokenizer(folder)
    return folder


def check_mxfp4_folder(folder, logits: bool = True) -> float | None:
    """pai-zoo's reader of the MXFP4 ``folder`` hands out, bit for bit, the weights transformers' own MXFP4 loader
    gives its model (bf16); with ``logits``, the megatron-core model of the folder gives transformers' logits in
    fp32 (returns max |delta|). A difference fails the conformance check ``mxfp4``."""
    import torch
    from transformers import GptOssForCausalLM, Mxfp4Config

    import pai_zoo
    from pai_zoo.formats.hf_folder import open_weights
    from pai_zoo_conformance.cases import _fail

    def transformers_model(dtype):
        return GptOssForCausalLM.from_pretrained(folder, quantization_config=Mxfp4Config(dequantize=True),
                                                 dtype=dtype).eval()

    theirs = transformers_model(torch.bfloat16).state_dict()
    with open_weights(folder) as source:
        for name in source.names():
            ours = source.get(name)
            if ours.dtype != theirs[name].dtype or ours.shape != theirs[name].shape:
                _fail("mxfp4", f"{name}: pai-zoo reads {ours.dtype} {list(ours.shape)}, transformers "
                               f"{theirs[name].dtype} {list(theirs[name].shape)}")
            if not torch.equal(ours.view(torch.uint8), theirs[name].contiguous().view(torch.uint8)):
                delta = (ours.float() - theirs[name].float()).abs().max().item()
                _fail("mxfp4", f"{name}: pai-zoo's MXFP4 decoding differs from transformers' (max |delta| {delta:.3g})")
    if not logits:
        return None
    vocab = MXFP4_CONFIG["vocab_size"]
    ids = torch.randint(0, vocab, (1, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = transformers_model(torch.float32)(input_ids=ids).logits
    got = pai_zoo.load(folder, dtype=torch.float32).logits(ids)[..., :vocab]
    delta = (got - expected).abs().max().item()
    if delta > 1e-4:
        _fail("mxfp4", f"logits of the MXFP4 folder differ from transformers' by {delta:.3g} (> 1e-4)")
    return delta
