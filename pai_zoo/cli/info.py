"""``pai-zoo info NAME``: a family's presets, config translation, weight table and recorded conformance."""
from __future__ import annotations

from ..tokenizers.names import describe_tokenizer
from ._common import add_command, family_or_preset, registry


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "info", "a family's presets, config translation and weight table")
    p.add_argument("name", help="family, alias or preset")
    p.set_defaults(func=run)


def _size(cfg: dict) -> str:
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return " ".join(f"{k.replace('num_', '').replace('_size', '')}={cfg[k]}" for k in keys if k in cfg)


def run(args) -> int:
    family = family_or_preset(args.name)
    reg = registry()
    plugin = reg.plugins.get(family.plugin)
    print(f"family:        {family.name}" + (f" - {family.description}" if family.description else ""))
    print(f"plugin:        {family.plugin} ({plugin.distribution} {plugin.version})" if plugin
          else f"plugin: {family.plugin}")
    print(f"aliases:       {', '.join(family.aliases) or '-'}")
    print(f"architectures: {', '.join(family.hf_architectures)}")
    print(f"model types:   {', '.join(family.model_types)}")
    print(f"tiny preset:   {family.tiny}")
    print(f"tokenizer:     {describe_tokenizer(family, args.name)}")
    print(f"megatron-core: {family.mcore_versions}")
    print(f"backends:      {', '.join(family.backends)}")
    print("presets:")
    for name, cfg in family.presets.items():
        print(f"  {name:<18} {cfg['model_type']:<10} {_size(cfg)}")
    print("config translation (HF -> megatron-core):")
    for rule in family.config_map.rules:
        print(f"  {rule.describe()}")
    from .. import hf

    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, family.presets[family.tiny])))
    table = reg.weight_map(family, config)
    print(f"weight map (rows for {family.tiny}; {{layer}} repeats per layer):")
    for kind, hf_names, mcore_names in table.describe():
        print(f"  {kind:<7} {hf_names}\n          -> {mcore_names}")
    print_conformance(family.name)
    return 0


def print_conformance(name: str) -> None:
    """The recorded conformance results of a family (:mod:`pai_zoo.conformance_record`)."""
    from .. import conformance_record

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
