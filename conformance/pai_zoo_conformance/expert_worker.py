"""Run under ``torchrun`` with ``--ep`` processes: load a Megatron-Core checkpoint of a mixture-of-experts model
(written by ``convert --to mcore``) with that expert parallelism (each rank builds its share of the experts;
megatron-core's ``dist_checkpointing`` gives each rank its own experts) and save rank 0's logits of given token
ids; with ``--save DIR``, save the model as that expert-parallel run would (megatron-core's
``dist_checkpointing.save``, each rank writing its own experts) into a checkpoint folder ``DIR``. Used by the
suite's expert-parallel check (:mod:`pai_zoo_conformance.expert_parallel`) and ``tests/test_moe.py``."""
from __future__ import annotations

import argparse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save", help="save the loaded model under this EP layout into this folder")
    parser.add_argument("--swap-experts", action="store_true",
                        help="swap the last rank's first two local experts of the first MoE layer (a broken layout, "
                             "for tests)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from pai_zoo.mcore.compat import apply_cpu_patch

    apply_cpu_patch()
    torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(expert_model_parallel_size=args.ep)
    model_parallel_cuda_manual_seed(1234)

    from pai_zoo.mcore import dist_ckpt
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.registry import get_registry

    config, meta = dist_ckpt.mcore_config_of(args.checkpoint)
    family = get_registry().family(config.family)
    model = build_gpt_model(family, config, padded_vocab_size=meta.get("padded_vocab_size"),
                            expert_model_parallel_size=args.ep).eval()
    local = next(layer.mlp.experts.local_experts for layer in model.decoder.layers if hasattr(layer.mlp, "experts"))
    assert len(local) * args.ep == config["num_moe_experts"], (len(local), config["num_moe_experts"])
    dist_ckpt.load_model_weights(model, args.checkpoint)
    if args.save:
        import json
        import shutil
        from pathlib import Path

        from megatron.core import dist_checkpointing

        save, source = Path(args.save), Path(args.checkpoint)
        if torch.distributed.get_rank() == 0:
            (save / dist_ckpt.RELEASE).mkdir(parents=True)
            record = json.loads((source / dist_ckpt.PAI_ZOO_CONFIG).read_text())
            record["expert_parallel"] = args.ep
            (save / dist_ckpt.PAI_ZOO_CONFIG).write_text(json.dumps(record))
            (save / dist_ckpt.TRACKER).write_text(dist_ckpt.RELEASE)
            shutil.copytree(source / dist_ckpt.HF_DIR, save / dist_ckpt.HF_DIR)
        torch.distributed.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), str(save / dist_ckpt.RELEASE))
    if args.swap_experts and torch.distributed.get_rank() == args.ep - 1:
        with torch.no_grad():
            first = local[0].linear_fc1.weight.detach().clone()
            local[0].linear_fc1.weight.copy_(local[1].linear_fc1.weight)
            local[1].linear_fc1.weight.copy_(first)
    with torch.no_grad():
        logits = mcore_forward(model, torch.load(args.ids))
    if torch.distributed.get_rank() == 0:
        torch.save(logits, args.out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
