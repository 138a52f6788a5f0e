"""For "the suite fails on X" tests: a copy of a family with one mechanism turned off, which the suite must catch."""
from __future__ import annotations

import dataclasses

from pai_zoo.families.family import Family
from pai_zoo.plugin.config_map import ConfigMap, Rule


def with_rule(family: Family, kind: type, replacement: Rule, name: str) -> Family:
    """A copy of ``family`` named ``name`` whose config rules of class ``kind`` are ``replacement`` (a subclass that
    turns the mechanism off); ``AssertionError`` when the family has no such rule. The copy is a family object of its
    own, so :func:`pai_zoo_conformance.checks.shared_case` builds it a case of its own."""
    rules = [replacement if isinstance(rule, kind) else rule for rule in family.config_map.rules]
    assert any(isinstance(rule, kind) for rule in family.config_map.rules), f"{family.name} has no {kind.__name__}"
    return dataclasses.replace(family, name=name,
                               config_map=ConfigMap(*rules, passthrough=tuple(family.config_map.passthrough)))
