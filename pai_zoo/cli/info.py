"""``pai-zoo info NAME|CHECKPOINT``: a family's presets, config translation, weight table and recorded conformance;
for a checkpoint folder (Hugging Face or Megatron), first what ``pai-zoo inspect`` prints, then its family's info."""
from __future__ import annotations

from pathlib import Path

from ..hf.config_cache import full_config_dict
from ..models.inspection import inspect_checkpoint
from ..plugin.errors import UnknownModelError
from ..testing import conformance_record
from ..tokenizers.names import describe_tokenizer
from ._common import add_command, add_revision, family_or_preset, hub_args, registry


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "info", "a family's presets, config translation and weight table; for a "
                                        "checkpoint folder, what it holds (as inspect) and then its family's")
    p.add_argument("name", metavar="name|checkpoint", help="family, alias or preset, or a checkpoint folder: Hugging "
                                                           "Face (or a Hub id, org/name), or Megatron (pai-zoo's or "
                                                           "Megatron-LM's)")
    p.add_argument("--family", help="checkpoint: the family name, when a Megatron-LM checkpoint's args fit several")
    p.add_argument("--tokenizer", metavar="DIR", help="checkpoint: the original HF folder of a Megatron-LM one")
    p.add_argument("--iteration", help="checkpoint: a saved iteration other than the tracker's (a number or "
                                       "'release')")
    add_revision(p, "the checkpoint")
    p.set_defaults(func=run)


def _is_folder_argument(name: str) -> bool:
    """A folder, not a registered name: a path with a separator, or an existing folder no family or preset is
    called (a registered name wins over a folder of the same name in the working directory)."""
    if "/" in name or "\\" in name or name in (".", ".."):
        return True
    reg = registry()
    return Path(name).is_dir() and not reg.is_preset(name) and not _is_family(reg, name)


def _is_family(reg, name: str) -> bool:
    try:
        reg.family(name)
    except UnknownModelError:
        return False
    return True


def _size(cfg: dict) -> str:
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return " ".join(f"{k.replace('num_', '').replace('_size', '')}={cfg[k]}" for k in keys if k in cfg)


def run(args) -> int:
    if _is_folder_argument(args.name):
        hub_args(args, "name")  # a Hub id: its snapshot in the Hugging Face cache
        report = inspect_checkpoint(args.name, family=args.family, tokenizer=args.tokenizer,
                                    iteration=args.iteration)
        print("\n".join(report.lines()))
        print()
        family = registry().family(report.family)
        print_family(family, family.name)
        return 0
    print_family(family_or_preset(args.name), args.name)
    return 0


def print_family(family, name: str) -> None:
    """The family's info: plugin, names, presets, config translation, weight table, recorded conformance."""
    reg = registry()
    plugin = reg.plugins.get(family.plugin)
    print(f"family:        {family.name}" + (f" - {family.description}" if family.description else ""))
    print(f"plugin:        {family.plugin} ({plugin.distribution} {plugin.version})" if plugin
          else f"plugin: {family.plugin}")
    print(f"aliases:       {', '.join(family.aliases) or '-'}")
    print(f"architectures: {', '.join(family.hf_architectures)}")
    print(f"model types:   {', '.join(family.model_types)}")
    print(f"tiny preset:   {family.tiny}")
    print(f"tokenizer:     {describe_tokenizer(family, name)}")
    print(f"megatron-core: {family.mcore_versions}")
    print(f"backends:      {', '.join(family.backends)}")
    print("presets:")
    for name, cfg in family.presets.items():
        print(f"  {name:<18} {cfg['model_type']:<10} {_size(cfg)}")
    print("config translation (HF -> megatron-core):")
    for rule in family.config_map.rules:
        print(f"  {rule.describe()}")

    config = family.to_mcore_config(full_config_dict(family, family.presets[family.tiny]))  # cached: no transformers
    table = reg.weight_map(family, config)
    print(f"weight map (rows for {family.tiny}; {{layer}} repeats per layer):")
    for kind, hf_names, mcore_names in table.describe():
        print(f"  {kind:<7} {hf_names}\n          -> {mcore_names}")
    print_conformance(family.name)


def print_conformance(name: str) -> None:
    """The recorded conformance results of a family (:mod:`pai_zoo.testing.conformance_record`)."""

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
        deltas = result.get("max_abs_delta")
        if isinstance(deltas, dict) and deltas:
            print("          max |delta|: " + ", ".join(f"{label} {value:.3g}" if isinstance(value, (int, float))
                                                      else f"{label} {value}" for label, value in deltas.items()))
