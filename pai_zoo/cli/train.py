"""``pai-zoo train [CONFIG.yaml] --model M --data PREFIX --save DIR``: continued pretraining or SFT.

Every flag is a :class:`~pai_zoo.training.config.TrainConfig` field, spelled as
:data:`~pai_zoo.training.config.SETTINGS` says: pai-zoo's flag first, then Megatron-LM's name for
it (``--micro-batch-size``, ``--tensor-model-parallel-size``, ``--data-path``, ``--load``,
``--lr-warmup-iters``...). The help shows the field's default. A flag overrides the YAML file, which
overrides the defaults (so the flags' own defaults are None); the settings are handed on as the user
spelled them, so that an error names the flag that was given.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..data.prefix import resolve_prefix, resolve_sft_prefix
from ..hf.models import config_dict, hf_config
from ..mcore.parallel_sizes import check_layout
from ..models.handle import resolve
from ..plugin.errors import PaiZooError
from ..training.config import SETTINGS, TrainConfig, TrainConfigError
from ..training.launch_plan import DEFAULT_ENDPOINT, check_endpoint, check_nodes, launch_lines, sbatch_script
from ..training.plan import make_plan, plan_lines
from ..training.save_dir import check_save_dir
from ..util.dist import is_rank0, world_size
from ..util.files import write_text_atomic
from ..util.hub import hub_paths
from ._checks import check_model_name
from ._common import add_command, defaults, registry

#: where the flags as given are kept on the namespace: {option string: value}
GIVEN = "given_settings"


class _Given(argparse.Action):
    """Stores the value like ``store`` (or the switch's ``const``) and records the option string used."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if self.nargs == 0 else values
        setattr(namespace, self.dest, value)
        given = dict(getattr(namespace, GIVEN, None) or {})
        given[option_string] = True if self.nargs == 0 else values
        setattr(namespace, GIVEN, given)


def add_parser(subparsers) -> None:
    default = defaults(TrainConfig)
    p = add_command(subparsers, "train",
                    "continued pretraining or SFT on Megatron-Core (torchrun for several processes)",
                    epilog="Megatron-LM's flag names are accepted too (listed after pai-zoo's); a YAML file takes "
                           "the same settings as keys (learning_rate or lr, micro_batch_size, train_iters ...): "
                           "see docs/configuration.md.")
    p.add_argument("config", nargs="?", help="YAML file of settings (flags override it)")
    for name, setting in SETTINGS.items():
        if setting.switch is not None:
            p.add_argument(*setting.all_flags, dest=name, action=_Given, nargs=0, const=setting.switch,
                           default=None, help=setting.help)
            continue
        value = default.get(name)
        shown = f" (default: {value})" if value not in (None, "") else ""
        p.add_argument(*setting.all_flags, dest=name, action=_Given, nargs="+" if name == "data" else None,
                       metavar=name.upper(), help=setting.help + shown)
    p.add_argument("--plan", action="store_true",
                   help="print the memory per GPU of this model, layout and settings (parameters, gradients, Adam "
                        "state with and without the distributed optimizer, activations with and without recompute) "
                        "and stop: no training")
    p.add_argument("--gpus", type=int, metavar="N", help="with --plan: the GPUs of the run (default: TP x PP x CP)")
    p.add_argument("--gpu-memory", type=float, metavar="GB", help="with --plan: each GPU's memory, to compare with")
    p.add_argument("--nodes", type=int, metavar="N", help="with --plan: the machines of the run (with "
                   "--gpus-per-node); also prints each node's torchrun command and an sbatch script (docs/training.md)")
    p.add_argument("--gpus-per-node", type=int, metavar="M", help="with --plan --nodes: the GPUs of each machine")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="with --plan --nodes: node 0's address in the printed "
                   f"torchrun commands (default: {DEFAULT_ENDPOINT}, set on each node)")
    p.add_argument("--sbatch", metavar="FILE", help="with --plan --nodes: write the sbatch script to FILE (an "
                   "existing FILE is refused)")
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = TrainConfig.load(args.config, getattr(args, GIVEN, None) or {})
    if cfg.model:  # a Hub id: its snapshot in the Hugging Face cache (at --revision), read from there on
        cfg.model, cfg.revision = str(hub_paths(cfg.revision, cfg.model, flag="--revision ")[0]), None
    if args.plan:
        return plan(cfg, args.gpus, args.gpu_memory, launch=_launch_request(args))
    if args.nodes or args.gpus_per_node or args.rdzv_endpoint or args.sbatch:
        raise TrainConfigError("--nodes, --gpus-per-node, --rdzv-endpoint and --sbatch go with --plan (they print how "
                               "to launch); a run takes its machines from torchrun or srun")
    cfg.check_required()
    _check_before_loading(cfg)  # every setting, the model's name and the data files: before torch or the model
    check_save_dir(cfg.save, force=cfg.force, model=cfg.model)  # before torch, megatron or the model load
    from ..training.trainer import train

    last = train(cfg)
    if last and is_rank0():
        print(f"trained {cfg.model} -> {cfg.save}: step {last['step']}, loss {last['loss']:.4f}"
              + (f", eval loss {last['eval_loss']:.4f}" if "eval_loss" in last else ""))
    return 0


def _check_before_loading(cfg) -> None:
    """What can be refused without torch, megatron-core or the model, each setting named as given (``--lr -1.0``,
    ``lr: -1 (run.yaml)``): context parallelism and Transformer Engine where they cannot run, the settings' ranges
    and arithmetic, that ``--model`` names a preset, a family or an existing path, and that the ``--data`` files
    exist (their token ids against the model's vocabulary are checked once it is read)."""
    cfg.check_implementation()  # context parallelism or Transformer Engine where they cannot run: the real reason
    # the settings under this world, or under the smallest one the layout needs: whether the model's heads and
    # layers divide by the layout comes first, once its config is read, then the torchrun command to use
    need = cfg.tensor_parallel_size * cfg.pipeline_parallel_size * cfg.context_parallel_size
    cfg.check_settings(max(world_size(), need))
    try:
        check_model_name(cfg.model, registry())
    except PaiZooError as e:
        raise TrainConfigError(f"--model {cfg.model}: {e}") from None
    first = Path(str(cfg.data[0])) if cfg.data else None
    if cfg.sft and len(cfg.data) == 1 and (first.suffix == ".jsonl" or first.is_dir()):  # vision SFT data
        if not first.exists():
            raise TrainConfigError(f"--data {first}: no such file")
        return
    for prefix in cfg.data_blend()[0]:
        resolve_sft_prefix(prefix, what="--data") if cfg.sft else resolve_prefix(prefix, what="--data", first=".bin")


def _launch_request(args) -> dict | None:
    """``--plan``'s launch flags, checked (one line each), with the train arguments as given; None without
    ``--nodes``."""
    if args.nodes is None:
        if args.gpus_per_node or args.rdzv_endpoint or args.sbatch:
            raise TrainConfigError("--gpus-per-node, --rdzv-endpoint and --sbatch need --nodes N: the machines of the "
                                   "run")
        return None
    if args.gpus_per_node is None:
        raise TrainConfigError(f"--nodes {args.nodes} needs --gpus-per-node M: the GPUs of each machine")
    if args.gpus is not None and args.gpus != args.nodes * args.gpus_per_node:
        raise TrainConfigError(f"--gpus {args.gpus} disagrees with --nodes {args.nodes} x --gpus-per-node "
                               f"{args.gpus_per_node} = {args.nodes * args.gpus_per_node}; leave --gpus out")
    if args.sbatch and Path(args.sbatch).exists():
        raise TrainConfigError(f"--sbatch {args.sbatch}: the file exists; remove it or choose another name")
    arguments = ["train", *([args.config] if args.config else [])]
    for flag, value in (getattr(args, GIVEN, None) or {}).items():  # the train settings, as given, in order
        arguments += [flag] if value is True else [flag, *(value if isinstance(value, list) else [value])]
    return {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "arguments": [str(a) for a in arguments],
            "endpoint": check_endpoint(args.rdzv_endpoint or DEFAULT_ENDPOINT), "sbatch": args.sbatch}


def plan(cfg, gpus: int | None, gpu_memory: float | None, launch: dict | None = None) -> int:
    """``--plan``: the memory per GPU (:mod:`pai_zoo.training.plan`), from the model's config alone; with
    ``launch`` (``--nodes``), each node's torchrun command and an sbatch script
    (:mod:`pai_zoo.training.launch_plan`)."""

    if not cfg.model:
        raise TrainConfigError("--plan needs --model: the model to plan for (a preset, a Hugging Face folder or a "
                               "Megatron checkpoint)")
    source = resolve(cfg.model)
    config = source.mcore_config or source.family.to_mcore_config(config_dict(hf_config(source.family,
                                                                                        source.hf_config)))
    world = gpus or cfg.tensor_parallel_size * cfg.pipeline_parallel_size * cfg.context_parallel_size
    if launch is not None:
        world = check_nodes(launch["nodes"], launch["gpus_per_node"], cfg.tensor_parallel_size,
                            cfg.pipeline_parallel_size, cfg.context_parallel_size)
    check_layout(config, cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cp=cfg.context_parallel_size,
                 error=TrainConfigError)
    dp = cfg.data_parallel_size(world)
    cfg._check_scale(dp, gpu=True)
    cfg.check_model(config.num_layers, config.get("num_moe_experts"))
    if config.get("num_moe_experts"):
        raise TrainConfigError(f"--plan: {cfg.model} is a mixture-of-experts model, which the plan does not count "
                               "yet (dense models only)")
    print(f"plan for {cfg.model} ({source.family.name}), {'bfloat16' if cfg.bf16 else 'float32'}, micro-batch "
          f"{cfg.batch_size} x {cfg.sequence_length} tokens, global batch {cfg.global_batch_size}:")
    the_plan = make_plan(config, cfg, world)
    for line in plan_lines(the_plan, gpu_memory):
        print(line)
    if launch is not None:
        summary = f"{cfg.model}: {the_plan.layout}"
        if launch["sbatch"]:
            script = sbatch_script(launch["nodes"], launch["gpus_per_node"], launch["arguments"], summary)
            write_text_atomic(launch["sbatch"], script)
        for line in launch_lines(launch["nodes"], launch["gpus_per_node"], launch["arguments"], launch["endpoint"],
                                 summary, launch["sbatch"]):
            print(line)
    return 0
