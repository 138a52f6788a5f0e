"""``pai-zoo eval CKPT --data PREFIX... | --tasks NAMES``: held-out loss and perplexity, lm-evaluation-harness tasks.

``CKPT`` is anything :func:`pai_zoo.load` reads (a Hugging Face folder, a pai-zoo Megatron-Core checkpoint or training
run, a Megatron-LM checkpoint, a preset), with ``--adapter`` a LoRA run's or a PEFT folder's adapter. Under
torchrun ``--tp``/``--pp`` shard the model (a Hugging Face or Megatron-LM folder is converted into a scratch
folder first); the held-out loss also splits its sequences over the data-parallel ranks. Rank 0 prints the tables
and writes ``--output`` (a temporary name, renamed at the end: nothing is written when the run fails).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from ..data.prefix import resolve_prefix
from ..data.vocabulary import check_dataset_vocabulary
from ..evaluation.harness import check_tasks, make_lm, run_tasks, task_manager, tokenizer_folder
from ..evaluation.heldout import held_out_loss, planned_rows
from ..evaluation.report import loss_table, output, tasks_table, tracker_scalars, write_output
from ..evaluation.sequences import DEFAULT_PACKING, PACKINGS, dataset_prefix, read_sequences
from ..hf.config_cache import full_config_dict
from ..mcore.parallel_sizes import check_world
from ..models.handle import load, resolve
from ..models.tokenizer_fit import check_tokenizer_fit
from ..plugin.errors import SettingError
from ..util.dist import is_rank0, rank, shared_temporary_folder, world_size
from ..util.outputs import check_output
from ..util.progress import Progress
from ..util.trackers import Trackers, TrackerSettings, add_tracker_arguments
from ._checks import check_inputs, check_model_name
from ._common import add_command, add_revision, hub_args, registry

#: sequences (or lm-eval requests) per forward pass when the command line does not say
MICRO_BATCH_SIZE = 4
#: --seq-length when not given: this, or the model's context when that is shorter
SEQ_LENGTH = 2048
#: --seed when not given: pai-zoo train's (so --split gives the validation samples train evaluates)
SEED = 1234


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "eval", "held-out loss and perplexity (--data), lm-evaluation-harness tasks (--tasks)",
                    epilog="examples:\n  pai-zoo eval RUN --data held_out_text_document --output loss.json\n"
                           "  pai-zoo eval RUN --tasks hellaswag,arc_easy --num-fewshot 0 --limit 100\n"
                           "see docs/evaluation.md")
    p.add_argument("model", metavar="CKPT", help="Hugging Face folder, pai-zoo Megatron-Core checkpoint or run, "
                                                 "Megatron-LM checkpoint, Hugging Face Hub id (org/name), or preset")
    data = p.add_argument_group("held-out loss (--data)")
    data.add_argument("--data", nargs="+", action="extend", metavar="PREFIX",
                      help="datasets: .bin/.idx prefixes (PREFIX or PREFIX_text_document) or JSON Lines files "
                           "(tokenized with the model's tokenizer, an EOD after each document); WEIGHT PREFIX pairs "
                           "weight the blend's loss (default: every token counts the same); repeatable")
    data.add_argument("--seq-length", type=int, metavar="N",
                      help=f"tokens per sequence (default: {SEQ_LENGTH}, or the model's context if shorter)")
    data.add_argument("--micro-batch-size", type=int, default=MICRO_BATCH_SIZE, metavar="B",
                      help="sequences (and lm-eval requests) per forward pass")
    data.add_argument("--max-tokens", type=int, metavar="N", help="score at most N tokens of each dataset")
    data.add_argument("--packing", choices=tuple(PACKINGS), default=DEFAULT_PACKING,
                      help="document boundaries: " + "; ".join(f"{k}: {v}" for k, v in PACKINGS.items()))
    data.add_argument("--split", metavar="TRAIN,VALID,TEST",
                      help="--packing megatron: score the validation part of this split, as train --split "
                           "--eval-interval does (default: every document)")
    data.add_argument("--seed", type=int, default=SEED, help="--packing megatron: the documents' shuffle seed "
                                                            "(train's --seed)")
    tasks = p.add_argument_group("lm-evaluation-harness (--tasks)")
    tasks.add_argument("--tasks", metavar="NAMES", help="lm-eval task, group or tag names, comma-separated")
    tasks.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples per request (default: the "
                                                                     "task's)")
    tasks.add_argument("--limit", type=float, metavar="N",
                       help="documents per task: a count, or a fraction below 1")
    tasks.add_argument("--include-path", metavar="DIR", help="a folder of your own lm-eval task YAML files")
    tasks.add_argument("--log-samples", action="store_true",
                       help="--output keeps lm-eval's per-request samples (loglikelihoods, generations)")
    tasks.add_argument("--max-length", type=int, metavar="N",
                       help="lm-eval's context in tokens (default: the model's max_position_embeddings, else 2048)")
    tasks.add_argument("--apply-chat-template", action="store_true", help="render requests with the chat template")
    model = p.add_argument_group("model")
    model.add_argument("--backend", choices=("mcore", "hf"), default="mcore",
                       help="megatron-core, or transformers (the reference)")
    model.add_argument("--tp", type=int, default=1, help="tensor-parallel size (run under torchrun)")
    model.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (run under torchrun)")
    model.add_argument("--tokenizer", metavar="DIR",
                       help="a Hugging Face tokenizer folder (Megatron-LM checkpoint: the original HF folder)")
    model.add_argument("--iteration", help="Megatron checkpoint: a saved iteration other than the tracker's")
    add_revision(model, "CKPT")
    model.add_argument("--adapter", metavar="DIR",
                       help="apply a LoRA adapter (a LoRA run folder or a Hugging Face PEFT folder)")
    model.add_argument("--threads", type=int, help="torch CPU threads")
    model.add_argument("--tokenizer-mismatch-ok", action="store_true",
                       help="go on with a tokenizer that does not fit the model's config (another model's vocabulary "
                            "or special-token ids), which is refused otherwise")
    p.add_argument("--output", metavar="FILE", help="also write the results as JSON (must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    add_tracker_arguments(p)  # the results as scalars, at the checkpoint's iteration (docs/training.md)
    p.set_defaults(func=run)


def _positive(args, *names) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SettingError(f"--{name.replace('_', '-')} must be positive (got {value:g})")


def _split(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        weights = [float(x) for x in value.replace("/", ",").split(",")]
    except ValueError:
        weights = []
    if len(weights) != 3 or min(weights) < 0 or weights[1] <= 0:
        raise SettingError(f"--split {value}: expected three non-negative weights TRAIN,VALID,TEST with VALID > 0 "
                           "(train's --split, e.g. 99,1,0)")
    return ",".join(f"{w:g}" for w in weights)


def _data_blend(items: list[str]) -> tuple[list[str], list[float] | None]:
    """Megatron's ``--data-path`` forms: prefixes alone, or WEIGHT PREFIX pairs."""
    def number(s):
        try:
            return float(s)
        except ValueError:
            return None

    if number(items[0]) is None:
        return items, None
    weights = [number(w) for w in items[0::2]]
    if len(items) % 2 or any(w is None or w <= 0 for w in weights):
        raise SettingError(f"--data {' '.join(items)}: expected PREFIX... or WEIGHT PREFIX [WEIGHT PREFIX ...] with "
                           "positive weights")
    return items[1::2], weights


def _mcore_config(source):  # a Hugging Face config with its class's defaults: cached, no transformers after once
    return source.mcore_config or source.family.to_mcore_config(full_config_dict(source.family, source.hf_config))


def _check_data_files(args) -> None:
    """The ``--data`` files exist (JSON Lines files, or the ``.bin``/``.idx`` of each prefix), before the model is
    read; their token ids are checked against its vocabulary by :func:`_check_inputs`."""
    for given in _data_blend(args.data)[0] if args.data else []:
        if Path(given).suffix in (".jsonl", ".json"):
            if not Path(given).is_file():
                raise SettingError(f"--data {given}: no such file")
        else:
            resolve_prefix(given, what="--data", first=".bin")


def _check_inputs(args, source) -> tuple[int, list[str], list[float] | None, list[str]]:
    """Everything that can be refused before the model loads: lengths against its context, the data files and
    the task names."""
    config = _mcore_config(source)
    context, vocab_size = config.get("max_sequence_length"), config["vocab_size"]
    seq_length = args.seq_length or (min(SEQ_LENGTH, context) if context else SEQ_LENGTH)
    for flag, value in (("--seq-length", seq_length), ("--max-length", args.max_length)):
        if value is not None and context and value > context:
            raise SettingError(f"{flag} {value}: the model has {context} positions (max_position_embeddings in "
                               f"{args.model}); give {flag} {context} or less")
    prefixes, weights = _data_blend(args.data) if args.data else ([], None)
    for given in prefixes:
        path = Path(given)
        if path.suffix in (".jsonl", ".json") and not path.is_file():
            raise SettingError(f"--data {given}: no such file")
        if not path.is_file():
            check_dataset_vocabulary(resolve_prefix(given, what="--data", first=".bin"), vocab_size, args.model)
    names = [n.strip() for n in (args.tasks or "").split(",") if n.strip()]
    if args.tasks is not None and not names:
        raise SettingError("--tasks: give lm-eval task names, comma-separated")
    return seq_length, prefixes, weights, names


def run(args) -> int:
    if not args.data and not args.tasks:
        raise SettingError("give --data PREFIX (held-out loss) or --tasks NAMES (lm-evaluation-harness), or both")
    _positive(args, "tp", "pp", "micro_batch_size", "max_tokens", "seq_length", "max_length", "threads")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise SettingError(f"--num-fewshot must be 0 or more (got {args.num_fewshot})")
    if args.limit is not None and args.limit <= 0:
        raise SettingError(f"--limit must be positive (got {args.limit:g})")
    split = _split(args.split)
    if split is not None and args.packing != "megatron":
        raise SettingError("--split chooses Megatron's validation samples; it needs --packing megatron")
    if args.backend == "hf" and (args.tp > 1 or args.pp > 1):
        raise SettingError("--backend hf runs in one process; --tp/--pp shard the megatron-core model")
    check_world(args.tp, args.pp)  # in one process: the torchrun command to use, before anything loads
    hub_args(args, "model")  # Hub ids: their snapshots in the Hugging Face cache
    check_model_name(args.model, registry())  # the flags' values were checked as argparse read them (_checks)
    check_inputs((args.tokenizer, "--tokenizer"), (args.adapter, "--adapter"), (args.include_path, "--include-path"))
    if args.output:  # exists, not writable: refused before anything loads
        check_output(args.output, force=args.force, flag="--output", echo=is_rank0())
    _check_data_files(args)
    tracked = TrackerSettings.from_mapping(args)
    tracked.check()  # the tensorboard / wandb package a flag needs
    source = resolve(args.model, tokenizer=args.tokenizer, iteration=args.iteration)
    check_tokenizer_fit(source, args.tokenizer, ok=args.tokenizer_mismatch_ok, where=args.model)  # before it loads
    seq_length, prefixes, weights, names = _check_inputs(args, source)
    manager = None
    if names:
        manager = task_manager(args.include_path)
        check_tasks(manager, names, args.include_path)
        if world_size() > args.tp * args.pp:
            raise SettingError(f"--tasks runs one lm-eval process per model copy: start {args.tp * args.pp} "
                               f"processes for --tp {args.tp} --pp {args.pp}, not {world_size()}")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    handle = load(args.model, backend=args.backend, tensor_parallel_size=args.tp if args.tp > 1 else None,
                  pipeline_parallel_size=args.pp if args.pp > 1 else None, tokenizer=args.tokenizer,
                  iteration=args.iteration, adapter=args.adapter)
    rank0 = is_rank0()
    progress = None if not args.no_progress and rank0 else False
    settings = {"model": str(args.model), "backend": args.backend, "tp": args.tp, "pp": args.pp,
                "adapter": args.adapter}
    report = results = None
    if prefixes:
        settings.update(seq_length=seq_length, packing=args.packing, micro_batch_size=args.micro_batch_size,
                        max_tokens=args.max_tokens, split=split, seed=args.seed)
        report = _held_out(handle, args, prefixes, weights, seq_length, split, progress, settings)
        if rank0:
            print(loss_table(report))
    if names:
        lm = make_lm(handle, tokenizer_folder(handle, args.tokenizer), batch_size=args.micro_batch_size,
                     max_length=args.max_length, progress=progress)
        limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
        settings.update(tasks=names, num_fewshot=args.num_fewshot, limit=limit, include_path=args.include_path,
                        max_length=lm.max_length)
        results = run_tasks(lm, names, manager, num_fewshot=args.num_fewshot, limit=limit,
                            log_samples=args.log_samples, apply_chat_template=args.apply_chat_template,
                            verbose=args.verbose)
        if rank0:
            print(tasks_table(results))
    if rank0 and tracked.enabled:
        trackers = Trackers(tracked, config=settings, writes=True)
        trackers.log({"step": _step_of(source, args.iteration)}, tracker_scalars(report, results), always=True)
        trackers.close()
    if rank0 and args.output:
        path = write_output(args.output, output(report, results, log_samples=args.log_samples, settings=settings),
                            force=args.force)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _held_out(handle, args, prefixes, weights, seq_length, split, progress, settings):
    tokenizer = handle.tokenizer
    tokenizer_dir = args.tokenizer or (None if tokenizer is None else str(_folder(tokenizer.path)))
    eod = tokenizer.eod_id if tokenizer is not None and tokenizer.eod_id is not None else 0
    # megatron's GPTDataset: rank 0 writes the sample index into the shared cache, the others read it
    with shared_temporary_folder("pai-zoo-eval-") as scratch:
        mine = scratch / f"rank{rank()}"  # a JSON Lines file is tokenized by every rank, into its own folder
        mine.mkdir()
        datasets = []
        for index, given in enumerate(prefixes):
            prefix = dataset_prefix(given, tokenizer_dir, mine, index)
            datasets.append(read_sequences(given, prefix, seq_length=seq_length, packing=args.packing,
                                           vocab_size=handle.vocab_size, eod=eod, seed=args.seed, split=split,
                                           cache=scratch / "cache", model=str(args.model),
                                           tokenizer=args.tokenizer))
        total = sum(n for d in datasets for _, n in planned_rows(d, args.max_tokens))
        share = max(1, world_size() // (args.tp * args.pp))
        bar = Progress("eval", units=("tokens",), totals={"tokens": -(-total // share)}, enabled=progress)
        report = held_out_loss(handle, datasets, micro_batch_size=args.micro_batch_size, max_tokens=args.max_tokens,
                               weights=weights, on_tokens=lambda n: bar.update(tokens=n), settings=settings)
        bar.close()
    return report


def _folder(path) -> Path:
    path = Path(path)
    return path if path.is_dir() else path.parent


def _step_of(source, iteration) -> int:
    """The step the trackers log the results at: the evaluated checkpoint's iteration (a training run's latest, or
    ``--iteration``), else 0."""
    folder = getattr(source, "weights_folder", None)
    match = re.fullmatch(r"iter_(\d+)", Path(folder).name) if folder is not None else None
    if match:
        return int(match.group(1))
    return int(iteration) if str(iteration or "").isdigit() else 0
