"""``pai-zoo list``: installed plugins, versions, families, broken plugins (imports neither torch nor megatron)."""
from __future__ import annotations

import json
import sys

from ..families.family import installed_mcore_version
from ..plugin.errors import PaiZooError
from ._common import add_command, registry


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "list", "installed plugins, their families, broken plugins")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    reg = registry()
    plugins = sorted(reg.plugins.values(), key=lambda p: p.name)
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
                (f"{f} ({', '.join(reg.families[f].aliases)})" if reg.families[f].aliases else f)
                + (f" [text, {', '.join(reg.families[f].vision.modalities)}]" if reg.families[f].vision else "")
                for f in p.families
            )
        rows.append((p.name, p.distribution or "-", p.version or "-", what))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    _print_versions(reg)
    if reg.selected is not None:
        print(f"(plugins selected by PAI_ZOO_PLUGINS: {', '.join(sorted(reg.selected))})")
        if reg.missing_selected:
            print("warning: PAI_ZOO_PLUGINS names plugins that are not installed: "
                  f"{', '.join(reg.missing_selected)}", file=sys.stderr)
    return 0


def _print_versions(reg) -> None:
    """Families grouped by the megatron-core versions and backends they support."""

    installed = installed_mcore_version()
    groups: dict[tuple[str, str, bool], list[str]] = {}  # (versions, backends, supported) -> families
    for name in sorted(reg.families):
        family = reg.families[name]
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
