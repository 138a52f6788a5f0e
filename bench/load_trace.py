"""How many pai-zoo modules a ``pai_zoo.load`` of each checkpoint format passes through, and how often it comes back
to a module it had already left (issue 42's measure of where reading a format wanders).

The trace follows the argument: a call counts when one of its arguments is the checkpoint's path or a path inside it
(a ``str`` or ``Path``), so the walk is the one ``name_or_path`` takes through the calls that pass it on
(``sys.setprofile``). Consecutive calls in one module are one visit; a *return* is a visit to a module that the walk
had already left. ``--show`` prints each walk.

    python bench/load_trace.py [--show] [--shared ../shared/megatron-lm-fixtures]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def _touches(value, roots: tuple[str, ...]) -> bool:
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        return any(text == r or text.startswith(r + os.sep) for r in roots)
    return False


def trace(fn, *roots) -> list[str]:
    """The pai_zoo modules, in call order (consecutive repeats collapsed), of the calls that take a path under
    ``roots`` as an argument."""
    roots = tuple(str(Path(r).resolve()) for r in roots) + tuple(str(r) for r in roots)
    walk: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("pai_zoo"):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(_touches(frame.f_locals.get(n), roots) for n in names):
            if not walk or walk[-1] != module:
                walk.append(module)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return walk


def counts(walk: list[str]) -> tuple[int, int]:
    """``(distinct modules, returns to a module already left)``."""
    seen, returns = set(), 0
    for module in walk:
        returns += module in seen
        seen.add(module)
    return len(seen), returns


def _fixtures(tmp: Path, shared: Path | None) -> dict[str, tuple[Path, dict]]:
    import pai_zoo

    handle = pai_zoo.load("llama3-tiny", backend="hf")
    hf = tmp / "hf"
    handle.model.save_pretrained(hf)
    if handle.tokenizer is not None and hasattr(handle.tokenizer, "save_pretrained"):
        handle.tokenizer.save_pretrained(hf)
    mcore = tmp / "mcore"
    pai_zoo.convert(hf, mcore, to="mcore", progress=False)
    peft = tmp / "peft"
    from peft import LoraConfig, get_peft_model

    get_peft_model(handle.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(peft)
    out = {"hf": (hf, {}), "mcore (pai-zoo)": (mcore, {}), "peft adapter (on hf)": (hf, {"adapter": peft})}
    if shared is not None and shared.is_dir():
        out["megatron-lm torch_dist"] = (shared / "llama-dist-tp2", {"tokenizer": shared / "llama-hf"})
        out["megatron-lm legacy torch"] = (shared / "llama-legacy-tp2", {"tokenizer": shared / "llama-hf"})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print each walk")
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
                        / "megatron-lm-fixtures")
    args = parser.parse_args(argv)
    import pai_zoo

    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, kwargs) in _fixtures(Path(tmp), args.shared).items():
            pai_zoo.load(path, **kwargs)  # warm: imports and caches are not the walk
            walk = trace(lambda: pai_zoo.load(path, **kwargs), kwargs.get("adapter", path))
            modules, returns = counts(walk)
            print(f"{name:26s} {modules:3d} modules, {returns:3d} returns")
            if args.show:
                print("    " + " -> ".join(m.removeprefix("pai_zoo.") for m in walk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
