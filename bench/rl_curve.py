"""The RL figure of docs/rl.md: the toy GRPO task's reward curve, drawn from the run's own ``metrics.jsonl``.

    python bench/rl_curve.py [--steps 40] [--seeds 0,1,2] [--out docs/grpo_reward_curve.png]

The task (the one ``plugins/pai-zoo-rl/tests/test_dpo_grpo.py`` checks): a tiny Llama (``llama3-tiny``'s weights,
saved as a checkpoint) answers short prompts; the built-in ``format`` reward gives 1 to a completion that starts with
a letter from a to m (about 1 in 8 tokens at random). ``pai-zoo rl grpo`` with 8 completions per prompt, 4 prompts a
step, 2-token completions, ``--beta 0.04``, ``--lr 1e-2``, on one torch thread. The figure plots each seed's mean
reward per step and prints the first and last 5 steps' means; the PNG is drawn with Pillow (no plotting library).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import tempfile
from pathlib import Path

WORDS = "the cat sat on a mat with some red hats and blue dogs".split()
COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


def run(root: Path, steps: int, seed: int) -> list[float]:
    import torch

    import pai_zoo
    from pai_zoo.cli import main
    from pai_zoo.families.registry import get_registry

    torch.set_num_threads(1)
    model = root / "model"
    if not model.is_dir():
        pai_zoo.load("llama3-tiny", backend="hf").model.save_pretrained(model)
        get_registry().family("llama").test_tokenizer(model)
    rng = random.Random(0)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))),
                                           "pattern": r"^[a-m].*"}) + "\n" for _ in range(16)))
    save = root / f"grpo-{seed}"
    with contextlib.redirect_stdout(io.StringIO()):  # the run's JSON summary
        code = main(["rl", "grpo", "--model", str(model), "--data", str(prompts), "--save", str(save),
                     "--reward-funcs", "format", "--num-generations", "8", "--batch-size", "4",
                     "--max-completion-length", "2", "--beta", "0.04", "--lr", "1e-2", "--steps", str(steps),
                     "--seed", str(seed), "--quiet"])
    assert code == 0, code
    return [json.loads(line)["reward"] for line in (save / "metrics.jsonl").read_text().splitlines()]


def draw(curves: dict[int, list[float]], out: Path) -> None:
    from PIL import Image, ImageDraw

    width, height, left, bottom, top, right = 640, 360, 56, 40, 36, 16
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    steps = max(len(c) for c in curves.values())
    x = lambda i: left + (width - left - right) * i / max(steps - 1, 1)  # noqa: E731
    y = lambda v: height - bottom - (height - bottom - top) * v  # noqa: E731
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        pen.line([(left, y(tick)), (width - right, y(tick))], fill=(225, 225, 225))
        pen.text((8, y(tick) - 6), f"{tick:.2f}", fill="black")
    for i in range(0, steps, 5):
        pen.text((x(i) - 4, height - bottom + 6), str(i + 1), fill="black")
    pen.line([(left, top), (left, height - bottom), (width - right, height - bottom)], fill="black")
    pen.text((left, 10), "pai-zoo rl grpo: mean reward per step (toy format task, llama3-tiny)", fill="black")
    pen.text((width // 2 - 20, height - 16), "step", fill="black")
    for k, (seed, rewards) in enumerate(sorted(curves.items())):
        colour = COLOURS[k % len(COLOURS)]
        pen.line([(x(i), y(r)) for i, r in enumerate(rewards)], fill=colour, width=2)
        pen.text((width - right - 70, height - bottom - 14 * (len(curves) - k) - 6), f"seed {seed}", fill=colour)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" /
                        "grpo_reward_curve.png")
    args = parser.parse_args()
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            curves[seed] = run(Path(tmp), args.steps, seed)
            first, last = sum(curves[seed][:5]) / 5, sum(curves[seed][-5:]) / 5
            print(f"seed {seed}: mean reward, first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    draw(curves, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
