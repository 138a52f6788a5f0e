"""Start-up of the ``pai-zoo`` command: how long each answer takes when it loads no model (issue 44: under 2 s).

Each case runs in a fresh process, ``--runs`` times (median): ``python -c pass`` (the floor), ``pai-zoo --help``,
``list``, ``info llama``, ``inspect`` of a tiny Hugging Face folder and of a tiny Megatron-Core checkpoint, and a flag
error of each of ``generate``, ``train``, ``eval``, ``convert`` and ``preprocess``. Before the timing, the tiny
folder is written (llama3-tiny, random weights) and converted with ``pai-zoo convert``; ``info`` and ``inspect``
keep the config with transformers' defaults in pai-zoo's cache folder (:mod:`pai_zoo.hf.config_cache`), so the
first run of each on an empty cache is timed once too (``cold``). Python's bytecode is cached as after ``pip
install`` (in a scratch ``PYTHONPYCACHEPREFIX``, filled by one untimed run of each case; ``--no-bytecode-cache``
keeps ``PYTHONDONTWRITEBYTECODE`` as the environment sets it, and every run compiles pai-zoo's sources again). Each
case prints its seconds, the ratio to ``python -c pass`` and whether it is under the target::

    python bench/startup_bench.py [--runs 5] [--json] [--no-bytecode-cache]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 2.0  # seconds


def _command() -> list[str]:
    script = Path(sys.executable).parent / "pai-zoo"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pai_zoo.cli"]


def _time(argv: list[str], env: dict, runs: int, code: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != code:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}, expected {code}\n{proc.stderr[-2000:]}")
    return statistics.median(times)


def _folders(root: Path, env: dict) -> tuple[Path, Path]:
    """A tiny Hugging Face folder and its Megatron-Core conversion (pai-zoo's own convert)."""
    hf, mcore = root / "hf", root / "mcore"
    subprocess.run([sys.executable, "-c", "import sys, pai_zoo; pai_zoo.load('llama3-tiny', backend='hf', seed=0)"
                    ".model.save_pretrained(sys.argv[1])", str(hf)], env=env, check=True, capture_output=True)
    subprocess.run([*_command(), "convert", str(hf), str(mcore), "--to", "mcore"], env=env, check=True,
                   capture_output=True)
    return hf, mcore


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case (the median is reported)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="keep the environment's PYTHONDONTWRITEBYTECODE (every run compiles the sources)")
    args = parser.parse_args(argv)

    pz = _command()
    with tempfile.TemporaryDirectory(prefix="pai-zoo-startup-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "PAI_ZOO_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
        if not args.no_bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        hf, mcore = _folders(root, env)
        out = root / "out"
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], 0),
            "pai-zoo --help": ([*pz, "--help"], 0),
            "pai-zoo list": ([*pz, "list"], 0),
            "pai-zoo info llama": ([*pz, "info", "llama"], 0),
            "pai-zoo inspect HF": ([*pz, "inspect", str(hf)], 0),
            "pai-zoo inspect MCORE": ([*pz, "inspect", str(mcore)], 0),
            "generate --temperature -1": ([*pz, "generate", "--model", str(hf), "--prompt", "hi", "--temperature",
                                           "-1"], 1),
            "train --lr -1": ([*pz, "train", "--model", str(hf), "--data", str(root / "data"), "--save", str(out),
                               "--lr", "-1"], 1),
            "eval --seq-length 0": ([*pz, "eval", str(hf), "--data", str(root / "data"), "--seq-length", "0"], 1),
            "convert --max-shard-size -5": ([*pz, "convert", str(hf), str(out), "--to", "hf", "--max-shard-size",
                                             "-5"], 1),
            "preprocess --workers 0": ([*pz, "preprocess", "--input", str(root / "x.jsonl"), "--output-prefix",
                                        str(out), "--tokenizer", str(hf), "--workers", "0"], 1),
        }
        for command, code in cases.values():  # untimed: the bytecode cache, and the config cache of info / inspect
            _time(command, env, 1, code)
        cold = {}  # the first info / inspect on an empty config cache (transformers imported once to fill it)
        for name in ("pai-zoo info llama", "pai-zoo inspect HF"):
            cold[name] = _time(cases[name][0], {**env, "PAI_ZOO_CACHE": str(root / f"cold-{len(cold)}")}, 1,
                               cases[name][1])
        seconds = {name: _time(command, env, args.runs, code) for name, (command, code) in cases.items()}
    floor = seconds["python -c pass"]
    results = {name: {"seconds": round(s, 3), "ratio": round(s / floor, 1), "under_target": s < TARGET}
               for name, s in seconds.items()}
    for name, s in cold.items():
        results[name + " (cold cache)"] = {"seconds": round(s, 3), "ratio": round(s / floor, 1),
                                           "under_target": s < TARGET}
    if args.json:
        print(json.dumps({"target_seconds": TARGET, "runs": args.runs, "cpus": os.cpu_count(),
                          "python": sys.version.split()[0], "bytecode_cache": not args.no_bytecode_cache,
                          "results": results}))
        return 0
    print(f"start-up, median of {args.runs} fresh processes ({os.cpu_count()} CPUs, bytecode "
          f"{'not cached' if args.no_bytecode_cache else 'cached'}; target {TARGET:g} s):")
    for name, r in results.items():
        mark = "ok" if r["under_target"] else "OVER"
        print(f"  {name:<40} {r['seconds']:6.2f} s  {r['ratio']:5.1f} x python -c pass  {mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
