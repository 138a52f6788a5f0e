"""Helpers for tests, demos and family plugins' test files (small artefacts built locally, no download)."""
