"""The README's families list and docs/families.md's table name every installed family."""
from pathlib import Path

import pytest

from pai_zoo.families.registry import get_registry

pytestmark = pytest.mark.no_megatron

ROOT = Path(__file__).resolve().parents[1]


def test_every_family_is_in_the_readme_and_the_families_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = (ROOT / "docs" / "families.md").read_text(encoding="utf-8")
    families = sorted(get_registry().families)
    assert len(families) >= 37
    missing_readme = [name for name in families if f"`{name}`" not in readme]
    missing_table = [name for name in families if f"\n| {name} | " not in table]
    assert not missing_readme, f"README.md does not name {missing_readme}"
    assert not missing_table, f"docs/families.md's table has no row for {missing_table}"
