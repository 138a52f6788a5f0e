"""The pai-zoo conformance suite: the checks every family plugin passes.

Use :class:`ConformanceSuite` from a plugin's tests, or the functions in
:mod:`pai_zoo_conformance.checks` directly.
"""
from .checks import ConformanceFailure
from .suite import ConformanceSuite

__all__ = ["ConformanceFailure", "ConformanceSuite"]
