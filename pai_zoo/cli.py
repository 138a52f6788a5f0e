"""The ``pai-zoo`` command line.

    pai-zoo list                 plugins, versions, families, broken plugins
    pai-zoo info NAME            a family (or preset): names, presets, config translation, weight table
    pai-zoo conformance NAME     run the conformance suite on an installed family
    pai-zoo convert SRC DST --to mcore|hf   Hugging Face folder <-> Megatron-Core checkpoint

``list`` imports neither torch nor megatron-core.
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import PaiZooError, UnknownModelError


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
    return 0


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
    return parser


def main(argv: list[str] | None = None) -> int:
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
