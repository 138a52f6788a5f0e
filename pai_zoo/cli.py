"""The ``pai-zoo`` command line.

    pai-zoo list                 plugins, versions, families, broken plugins
    pai-zoo info NAME            a family (or preset): names, presets, config translation, weight table
    pai-zoo conformance NAME     run the conformance suite on an installed family
    pai-zoo convert SRC DST --to mcore|hf   Hugging Face folder <-> Megatron-Core checkpoint
    pai-zoo preprocess --input PATH... --output-prefix PREFIX --tokenizer T   text -> .bin/.idx
    pai-zoo dataset inspect PREFIX | dataset merge --output-prefix OUT PREFIX...
    pai-zoo train [CONFIG.yaml] --model M --data PREFIX --save DIR [flags]   (torchrun for several processes)
    pai-zoo generate --model M --prompts IN.jsonl --output OUT.jsonl | --prompt TEXT   text generation
    pai-zoo rl list | rl reward --model M --data PAIRS.jsonl --save RM | rl ppo --actor M --reward RM ...   RL

``list`` imports neither torch nor megatron-core.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from .errors import PaiZooError, PaiZooWarning, UnknownModelError


def _registry():
    from .registry import get_registry

    return get_registry()


def cmd_list(args) -> int:
    registry = _registry()
    plugins = sorted(registry.plugins.values(), key=lambda p: p.name)
    if args.json:
        print(json.dumps([p.__dict__ | {"traceback": None} for p in plugins], indent=2))
        return 0
    if not plugins:
        print("no pai-zoo plugins installed (pip install pai-zoo-<family>)")
        return 0
    rows = [("PLUGIN", "DISTRIBUTION", "VERSION", "FAMILIES")]
    for p in plugins:
        if p.broken:
            what = f"BROKEN: {p.error}"
        else:
            what = ", ".join(
                f"{f} ({', '.join(registry.families[f].aliases)})" if registry.families[f].aliases else f
                for f in p.families
            )
        rows.append((p.name, p.distribution or "-", p.version or "-", what))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    from .family import installed_mcore_version

    installed = installed_mcore_version()
    groups: dict[tuple[str, str, bool], list[str]] = {}  # (versions, backends, supported) -> families
    for name in sorted(registry.families):
        family = registry.families[name]
        try:
            family.check_mcore_version(installed)
            supported = True
        except PaiZooError:
            supported = False
        groups.setdefault((family.mcore_versions, ", ".join(family.backends), supported), []).append(name)
    if groups:
        print(f"\nmegatron-core {installed or '(not installed)'}; families by the megatron-core versions and "
              "layer-spec backends they support:")
        for (versions, backends, supported), names in groups.items():
            note = "" if supported else f"   NOT SUPPORTED by megatron-core {installed or '(not installed)'}"
            print(f"  {versions}  [{backends}]: {', '.join(names)}{note}")
    if registry.selected is not None:
        print(f"(plugins selected by PAI_ZOO_PLUGINS: {', '.join(sorted(registry.selected))})")
        if registry.missing_selected:
            print(f"warning: PAI_ZOO_PLUGINS names plugins that are not installed: {', '.join(registry.missing_selected)}",
                  file=sys.stderr)
    return 0


def _family_or_preset(name: str):
    registry = _registry()
    if registry.is_preset(name):
        return registry.preset(name)[0]
    return registry.family(name)


def _size(cfg: dict) -> str:
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return " ".join(f"{k.replace('num_', '').replace('_size', '')}={cfg[k]}" for k in keys if k in cfg)


def cmd_info(args) -> int:
    family = _family_or_preset(args.name)
    registry = _registry()
    plugin = registry.plugins.get(family.plugin)
    print(f"family:        {family.name}" + (f" - {family.description}" if family.description else ""))
    print(f"plugin:        {family.plugin} ({plugin.distribution} {plugin.version})" if plugin else f"plugin: {family.plugin}")
    print(f"aliases:       {', '.join(family.aliases) or '-'}")
    print(f"architectures: {', '.join(family.hf_architectures)}")
    print(f"model types:   {', '.join(family.model_types)}")
    print(f"tiny preset:   {family.tiny}")
    print(f"megatron-core: {family.mcore_versions}")
    print(f"backends:      {', '.join(family.backends)}")
    print("presets:")
    for name, cfg in family.presets.items():
        print(f"  {name:<18} {cfg['model_type']:<10} {_size(cfg)}")
    print("config translation (HF -> megatron-core):")
    for rule in family.config_map.rules:
        print(f"  {rule.describe()}")
    from . import hf

    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, family.presets[family.tiny])))
    table = registry.weight_map(family, config)
    print(f"weight map (rows for {family.tiny}; {{layer}} repeats per layer):")
    for kind, hf_names, mcore_names in table.describe():
        print(f"  {kind:<7} {hf_names}\n          -> {mcore_names}")
    _print_conformance(family.name)
    return 0


def _print_conformance(name: str) -> None:
    """The recorded conformance results of a family (pai_zoo.conformance_record)."""
    from . import conformance_record

    try:
        results = conformance_record.read(name)
    except ValueError as exc:
        print(f"conformance: unreadable results: {exc}")
        return
    if results is None:
        print(f"conformance: not run yet - run `pai-zoo conformance {name}` "
              f"(results go to {conformance_record.results_path(name)})")
        return
    checks = results["checks"]
    passed = sum(1 for c in checks.values() if c.get("outcome") == "passed")
    print(f"conformance: {passed} of {len(checks)} checks passed (recorded {results.get('updated', '?')} in "
          f"{conformance_record.results_path(name)})")
    for check, result in checks.items():
        versions = ", ".join(f"{k.replace('_version', '')} {result[k]}"
                             for k in ("pai_zoo_version", "plugin_version", "mcore_version") if result.get(k))
        print(f"  {result.get('outcome', '?'):<7} {check:<48} {result.get('date', '?')}  {versions}")


def cmd_conformance(args) -> int:
    family = _family_or_preset(args.name)
    import pytest

    from pai_zoo_conformance import installed

    argv = [installed.__file__, "--pai-zoo-family", family.name, "-p", "no:cacheprovider", "-q", *args.pytest_args]
    return int(pytest.main(argv))


def cmd_convert(args) -> int:
    from .conversion import convert

    report = convert(
        args.src, args.dst, args.to, family=args.family, tp=args.tp, pp=args.pp, dtype=args.dtype,
        force=args.force, max_shard_size=args.max_shard_size, verify=args.verify, progress=None,
    )
    rate = report.bytes / report.seconds / 1e9 if report.seconds else 0.0
    print(f"converted {report.src} -> {report.dst} ({report.family}, to {report.to}): {report.tensors} tensors, "
          f"{report.bytes / 1e9:.3f} GB in {report.seconds:.1f} s ({rate:.2f} GB/s)")
    if report.verification is not None:
        v = report.verification
        print(f"verify: max |delta logits| = {v['max_abs_delta']:.3g} (tolerance {v['tolerance']:g}), "
              f"cosine = {v['cosine']:.6f}, next-token agreement = {v['next_token_agreement']:.1%}: "
              f"{'OK' if v['ok'] else 'FAILED'}")
    return 0 if report.ok else 3


def cmd_preprocess(args) -> int:
    from .data.preprocess import preprocess, preprocess_sft

    common = dict(workers=args.workers, skip_bad=args.skip_bad, batch_size=args.batch_size, progress=None)
    if args.sft:
        summary = preprocess_sft(args.input, args.output_prefix, args.tokenizer, seq_length=args.seq_length,
                                 pad_length=args.pad_length, pack=not args.no_pack, **common)
    else:
        summary = preprocess(args.input, args.output_prefix, args.tokenizer, json_keys=args.json_keys,
                             append_eod=args.append_eod, text_mode=args.text_mode,
                             add_special_tokens=not args.no_special_tokens, **common)
    for example in summary.skipped_examples:
        print(f"skipped: {example}", file=sys.stderr)
    print(summary.line())
    return 0


def cmd_train(args) -> int:
    from .training.config import TrainConfig
    from .training.trainer import train

    overrides = {name: getattr(args, name) for name in TRAIN_FLAGS if getattr(args, name, None) is not None}
    overrides.update({flag: True for flag in ("bf16", "sft") if getattr(args, flag)})
    if args.no_progress:
        overrides["progress"] = False
    cfg = TrainConfig.load(args.config, overrides)
    last = train(cfg)
    if last and (not torch_distributed_rank()):
        print(f"trained {cfg.model} -> {cfg.save}: step {last['step']}, loss {last['loss']:.4f}"
              + (f", eval loss {last['eval_loss']:.4f}" if "eval_loss" in last else ""))
    return 0


def torch_distributed_rank() -> int:
    import os

    return int(os.environ.get("RANK", 0))


#: ``pai-zoo train`` flags: TrainConfig field -> (flag names, help).
TRAIN_FLAGS = {
    "model": (("--model",), "preset, Hugging Face folder or Megatron-Core checkpoint"),
    "data": (("--data",), "PREFIX (preprocess output) or WEIGHT PREFIX WEIGHT PREFIX ... to blend"),
    "save": (("--save",), "output folder: checkpoints, metrics.jsonl; rerun to resume"),
    "batch_size": (("--batch-size", "--micro-batch-size"), "samples per data-parallel rank per micro-step (1)"),
    "global_batch_size": (("--global-batch-size",), "samples per optimizer step across ranks (32)"),
    "learning_rate": (("--learning-rate", "--lr"), "peak learning rate (5e-5)"),
    "min_learning_rate": (("--min-learning-rate", "--min-lr"), "floor of the cosine decay (5e-6)"),
    "sequence_length": (("--sequence-length", "--seq-length"), "tokens per sample (1024)"),
    "pad_length": (("--pad-length",), "SFT: pad sequences to a multiple of this (128)"),
    "save_interval": (("--save-interval",), "steps between checkpoints (1000)"),
    "train_tokens": (("--train-tokens",), "total training tokens (1638400)"),
    "warmup_tokens": (("--warmup-tokens",), "tokens of linear warm-up (163840)"),
    "weight_decay": (("--weight-decay",), "AdamW weight decay (0.1)"),
    "adam_beta1": (("--adam-beta1",), "(0.9)"),
    "adam_beta2": (("--adam-beta2",), "(0.95)"),
    "adam_eps": (("--adam-eps",), "(1e-8)"),
    "clip_grad": (("--clip-grad",), "max gradient norm, 0 = off (1.0)"),
    "seed": (("--seed",), "(1234)"),
    "split": (("--split",), "train,valid,test document weights (99,1,0)"),
    "eval_interval": (("--eval-interval",), "steps between evaluations, 0 = never (0)"),
    "eval_iters": (("--eval-iters",), "global batches per evaluation (10)"),
    "log_interval": (("--log-interval",), "steps between log lines (1)"),
    "tensor_parallel_size": (("--tensor-parallel-size", "--tp"), "(1)"),
    "pipeline_parallel_size": (("--pipeline-parallel-size", "--pp"), "(1)"),
}


def cmd_dataset_inspect(args) -> int:
    from .data.indexed import IndexedDatasetReader, statistics

    stats = statistics(args.prefix)
    for key, value in stats.items():
        print(f"{key + ':':<22} {value:.2f}" if isinstance(value, float) else f"{key + ':':<22} {value}")
    if args.document is not None:
        reader = IndexedDatasetReader(args.prefix)
        if not 0 <= args.document < reader.num_documents:
            raise PaiZooError(f"{args.prefix}: document {args.document} is out of range (0..{reader.num_documents - 1})")
        ids = reader.document(args.document).tolist()
        print(f"document {args.document}: {len(ids)} tokens")
        if args.tokenizer:
            from .tokenizer_names import resolve_tokenizer

            print(resolve_tokenizer(args.tokenizer).load().decode(ids))
        else:
            print(ids)
    return 0


def cmd_generate(args) -> int:
    from .generation import run_command

    return run_command(args)


def cmd_dataset_merge(args) -> int:
    from .data.indexed import merge, statistics

    merge(args.prefixes, args.output_prefix)
    stats = statistics(args.output_prefix)
    print(f"merged {len(args.prefixes)} datasets -> {args.output_prefix}: {stats['documents']} documents, "
          f"{stats['tokens']} tokens")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pai-zoo", description="A plugin-based model zoo for Megatron-Core.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="installed plugins, their families, broken plugins")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("info", help="a family's presets, config translation and weight table")
    p.add_argument("name", help="family, alias or preset")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("conformance", help="run the conformance suite on an installed family")
    p.add_argument("name", help="family, alias or preset")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments")
    p.set_defaults(func=cmd_conformance)
    p = sub.add_parser("convert", help="convert a Hugging Face folder <-> a Megatron-Core checkpoint")
    p.add_argument("src", help="Hugging Face folder (--to mcore) or Megatron-Core checkpoint (--to hf)")
    p.add_argument("dst", help="output folder (must not exist unless --force)")
    p.add_argument("--to", required=True, choices=("mcore", "hf"))
    p.add_argument("--family", help="family name (default: detected from config.json / pai_zoo.json)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size the checkpoint is laid out for")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size the checkpoint is laid out for")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="store tensors in this dtype (default: as the source)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (--to hf), e.g. 5GB, 500MB")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--verify", action="store_true", help="compare both sides' logits on a sample prompt")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("preprocess", help="tokenize text into Megatron indexed datasets (.bin/.idx)")
    p.add_argument("--input", nargs="+", required=True, help="JSON Lines (.jsonl[.gz|.zst]) or text files, or globs")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX_{key}_document.bin/.idx")
    p.add_argument("--tokenizer", required=True, help="checkpoint folder, tokenizer file, family or preset")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys to tokenize (one dataset each)")
    p.add_argument("--append-eod", action="store_true", help="end every document with the end-of-document token")
    p.add_argument("--no-special-tokens", action="store_true", help="do not let the tokenizer add BOS/EOS")
    p.add_argument("--text-mode", choices=("file", "paragraph"), default="file",
                   help="plain-text inputs: one document per file or per blank-line paragraph")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256, help="records per worker task")
    p.add_argument("--skip-bad", action="store_true", help="skip and count bad records instead of stopping")
    p.add_argument("--sft", action="store_true", help="instruction/chat records: tokens + loss mask, packed")
    p.add_argument("--seq-length", type=int, default=1024, help="--sft: tokens per packed sequence")
    p.add_argument("--pad-length", type=int, default=128, help="--sft --no-pack: pad each record to a multiple")
    p.add_argument("--no-pack", action="store_true", help="--sft: one record per sequence, padded")
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("train", help="continued pretraining or SFT on Megatron-Core (torchrun for several processes)")
    p.add_argument("config", nargs="?", help="YAML file of settings (flags override it)")
    for name, (flags, text) in TRAIN_FLAGS.items():
        p.add_argument(*flags, dest=name, nargs="+" if name == "data" else None, help=text)
    p.add_argument("--bf16", action="store_const", const=True, help="bfloat16 training (GPU)")
    p.add_argument("--sft", action="store_const", const=True, help="SFT data from preprocess --sft (loss mask, boundaries)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="complete prompts (JSON Lines in and out, or one streamed --prompt)")
    p.add_argument("--model", required=True, help="Megatron-Core checkpoint, Hugging Face folder or preset")
    p.add_argument("--prompts", help='JSON Lines: {"prompt": ...} (or {"messages": [...]} with --chat) per line')
    p.add_argument("--output", help="JSON Lines: each input record plus completion, token_ids, stop_reason")
    p.add_argument("--prompt", help="one prompt; the completion is streamed to stdout")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling probability mass (1.0 = all)")
    p.add_argument("--seed", type=int, help="seed for reproducible sampling")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (ChatML if it has none)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stop", nargs="+", metavar="S", help="strings that end a completion")
    p.add_argument("--truncate", choices=("left",), help="drop the oldest prompt tokens that do not fit the context")
    p.add_argument("--backend", choices=("mcore", "hf"), default="mcore")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (run under torchrun)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("dataset", help="inspect or merge indexed datasets")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    q = dsub.add_parser("inspect", help="counts and token statistics; decode a document")
    q.add_argument("prefix", help="PREFIX of PREFIX.bin/PREFIX.idx")
    q.add_argument("--document", type=int, help="show this document")
    q.add_argument("--tokenizer", help="decode the document with this tokenizer")
    q.set_defaults(func=cmd_dataset_inspect)
    q = dsub.add_parser("merge", help="concatenate datasets")
    q.add_argument("prefixes", nargs="+")
    q.add_argument("--output-prefix", required=True)
    q.set_defaults(func=cmd_dataset_merge)

    p = sub.add_parser("rl", add_help=False, help="RL trainers: rl list | rl NAME [flags] (ppo, reward, plugins')",
                       description="pai-zoo rl list | pai-zoo rl NAME [FLAGS] | pai-zoo rl run NAME [FLAGS]")
    p.add_argument("-h", "--help", dest="rl_help", action="store_true", help="the usage and the registered trainers")
    p.add_argument("rl_args", nargs=argparse.REMAINDER, help="list, or a trainer name and its flags")
    p.set_defaults(func=cmd_rl)
    return parser


def cmd_rl(args) -> int:
    from .rl.cli import main as rl_main

    return rl_main(["--help"] if args.rl_help else args.rl_args)


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """pai-zoo's own warnings as one ``pai-zoo: warning:`` line; others as Python shows them."""
    if issubclass(category, PaiZooWarning):
        print(f"pai-zoo: warning: {message}", file=sys.stderr if file is None else file)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UnknownModelError as exc:
        print(f"pai-zoo: error: {exc}", file=sys.stderr)
        return 2
    except PaiZooError as exc:
        print(f"pai-zoo: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
