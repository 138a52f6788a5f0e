"""Every measuring conformance check records its max |delta| with its outcome, and `pai-zoo info` shows them
(issue 18)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def test_record_keeps_the_deltas_and_info_shows_them(capsys, monkeypatch, tmp_path):
    from pai_zoo.cli.info import print_conformance
    from pai_zoo.testing import conformance_record

    monkeypatch.setenv("PAI_ZOO_CACHE", str(tmp_path))
    conformance_record.record("fam", {"test_forward_equivalence": "passed", "test_registration": "passed"},
                              deltas={"test_forward_equivalence": {"forward": 3.1e-06}})
    conformance_record.record("fam", {"test_tensor_and_pipeline_parallel_equivalence": "passed"},
                              deltas={"test_tensor_and_pipeline_parallel_equivalence": {"tp=2 pp=1": 1.5e-07,
                                                                                       "tp=1 pp=2": 0.0}})
    checks = conformance_record.read("fam")["checks"]
    assert checks["test_forward_equivalence"]["max_abs_delta"] == {"forward": 3.1e-06}  # kept from the first run
    assert checks["test_tensor_and_pipeline_parallel_equivalence"]["max_abs_delta"] == {"tp=2 pp=1": 1.5e-07,
                                                                                         "tp=1 pp=2": 0.0}
    assert "max_abs_delta" not in checks["test_registration"]
    print_conformance("fam")
    out = capsys.readouterr().out
    assert "max |delta|: forward 3.1e-06\n" in out and "max |delta|: tp=2 pp=1 1.5e-07, tp=1 pp=2 0\n" in out


@pytest.mark.megatron
@pytest.mark.megatron_once  # the record; the deltas themselves are checked in both passes
def test_a_suite_run_records_forward_and_round_trip_deltas(tmp_path):
    tests = tmp_path / "test_suite.py"
    tests.write_text(textwrap.dedent("""
        from pai_zoo_conformance import ConformanceSuite

        class TestLlama(ConformanceSuite):
            family = "llama"
    """))
    env = {k: v for k, v in os.environ.items() if k != "PAI_ZOO_PLUGINS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests), "-k",
                           "test_forward_equivalence or test_weights_round_trip_bit_identical"],
                          env={**env, "PAI_ZOO_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    checks = json.loads((tmp_path / "cache" / "conformance" / "llama.json").read_text())["checks"]
    forward = checks["test_forward_equivalence"]["max_abs_delta"]["forward"]
    assert 0 < forward <= 1e-4  # float32 rounding: not zero, far below the tolerance
    assert checks["test_weights_round_trip_bit_identical"]["max_abs_delta"] == {"round trip": 0.0}
