"""On the 2 ranks of the worker group (``pai_zoo_workers``): the Gemma-shaped test family (tests/gemma_like.py) whose
``layer_spec`` returns ``block_spec(config, layer, final_norm=ZeroCenteredNorm)``, built with pipeline
parallelism 2 (gloo) and loaded stage by stage with the transformers model's weights. :func:`stages` returns, on
rank 0, each stage's global layer numbers and final-norm class, and max |logits delta| vs transformers."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def stages() -> dict | None:
    import gemma_like
    import torch

    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel
    from pai_zoo.mcore.norms import ZeroCenteredNorm
    from pai_zoo.mcore.pipeline import forward_logits
    from pai_zoo.mcore.specs import block_spec, default_layer_spec
    from pai_zoo.models.state_dicts import hf_to_mcore, load_into, mcore_tensors
    from pai_zoo_conformance import checks

    torch.set_num_threads(1)
    ensure_model_parallel(1, 2)
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    fam = gemma_like.family(layer_spec=lambda c: block_spec(c, default_layer_spec(c), final_norm=ZeroCenteredNorm))
    hf_config = hf.hf_config(fam, {**gemma_like.TINY, "tie_word_embeddings": False})
    torch.manual_seed(0)
    hf_model = hf.build_hf_model(fam, hf_config).eval()
    checks._randomise(hf_model, 0, norm_identity=0.0)
    config = fam.to_mcore_config(hf.config_dict(hf_config))
    model = build_gpt_model(fam, config, pre_process=ps.is_pipeline_first_stage(),
                            post_process=ps.is_pipeline_last_stage()).eval()
    full = hf_to_mcore(fam, config, hf_model.state_dict())
    offset = get_transformer_layer_offset(model.config)
    state = {}
    for name in mcore_tensors(model):
        source = name
        if name.startswith("decoder.layers."):
            local = int(name.split(".")[2])
            source = name.replace(f"decoder.layers.{local}.", f"decoder.layers.{local + offset}.", 1)
        state[name] = full[source]
    load_into(model, state, f"stage {ps.get_pipeline_model_parallel_rank()}")
    ids = torch.randint(0, config["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = forward_logits(model, ids)[..., :config["vocab_size"]]
        expected = hf_model(input_ids=ids).logits
    final = model.decoder.final_layernorm
    stage = {"layers": [layer.layer_number for layer in model.decoder.layers],
             "final_norm": type(final).__name__ if final is not None else None}
    every = [None, None]
    torch.distributed.all_gather_object(every, stage)
    if torch.distributed.get_rank() == 0:
        return {"stages": every, "delta": (got - expected).abs().max().item()}
    return None
