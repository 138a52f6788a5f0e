"""``pai-zoo plugin new NAME --from-config CONFIG [--like FAMILY]``: a plugin distribution for a new architecture,
generated from its Hugging Face config and measured against transformers (:mod:`pai_zoo.scaffold`)."""
from __future__ import annotations

from pathlib import Path

from ..scaffold import new_plugin
from ..util.outputs import check_output
from ._common import add_command


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "plugin", "start a third-party plugin")
    psub = p.add_subparsers(dest="plugin_command", required=True)
    q = add_command(psub, "new", "generate a plugin distribution from an HF config (Llama-shaped architectures, with "
                                 "fused rows, norm placements, MoE, layer patterns and multipliers)")
    q.add_argument("name", help="the family and plugin name (lower case, dashes): writes pai-zoo-NAME")
    q.add_argument("--from-config", required=True, metavar="CONFIG",
                   help="an HF checkpoint folder, its config.json, or a transformers model_type or causal-LM class "
                        "name (the config class's defaults)")
    q.add_argument("--like", metavar="FAMILY", help="an installed family whose config rules are matched first")
    q.add_argument("--output", metavar="DIR", help="the distribution's folder (default: ./pai-zoo-NAME)")
    q.add_argument("--force", action="store_true", help="replace --output if it exists")
    q.set_defaults(func=run_new)


def run_new(args) -> int:
    # exists without --force, not writable: refused before the config is read and measured
    if args.output is not None or ("/" not in args.name and not args.name.startswith(".")):  # a bad NAME: below
        check_output(args.output or Path.cwd() / f"pai-zoo-{args.name}", force=args.force, kind="folder",
                     flag="--output")
    draft = new_plugin(args.name, args.from_config, args.output, like=args.like, force=args.force)
    folder = args.output or f"./{draft.distribution}"
    print(f"wrote {folder}: {draft.distribution} (package {draft.package}, family {draft.name!r}, presets "
          f"{', '.join(draft.presets())})")
    for line in draft.tried:
        print(f"  measured {line}")
    for mechanism in draft.found:
        print(f"  recognised {mechanism}")
    for key, note in draft.variant_notes.items():
        print(f"  {key}={draft.variants[key]!r}: {note}")
    if draft.stubs:
        print(f"{len(draft.stubs)} stub(s), marked 'STUB (pai-zoo plugin new)' in {draft.package}/__init__.py; the "
              "conformance suite fails until they are written:")
        for stub in draft.stubs:
            print(f"  - {stub}")
        return 0
    deltas = ", ".join(f"{p} {d:.2g}" for p, d in draft.measured.items())
    print(f"max |logits delta| vs transformers: {deltas}")
    print(f"next: pip install -e {folder} && pai-zoo conformance {draft.name}")
    return 0
