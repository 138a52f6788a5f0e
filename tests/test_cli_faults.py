"""Every subcommand under every kind of fault, as one table: missing path, malformed file, truncated file,
mismatched tokenizer, out-of-range flag, existing output, read-only output, full disk, SIGKILL midway, SIGINT midway.

Each cell runs the real command (a child of a command server that has imported everything once, so a cell costs
what the command does, not a Python start) and asserts:

- an error: exit 1 (or argparse's 2), one ``pai-zoo: error:`` line on stderr plus at most a ``hint:``, no traceback,
  the text that names the thing at fault, and the output folder exactly as it was (nothing written, nothing left);
- SIGKILL just before the output is published: the destination as it was, the temporary ``.NAME.pai-zoo-tmp-PID``
  beside it (nothing can clean up after a SIGKILL), and the next run to the same destination names and removes it,
  then succeeds; for a training run, the next run resumes;
- SIGINT just before the output is published (Ctrl-C): exit 130 and the destination as it was, no temporary; a
  training run saves the step in progress and says how to resume, and the next run resumes.

A cell that cannot apply is in :data:`NOT_APPLICABLE` with the reason: ``test_every_cell_is_decided`` keeps the table
whole. The full disk and the read-only folder are real: the command server runs in a user and mount namespace
(``unshare -rm``) where ``full/`` is a small tmpfs filled to the last block and ``ro/`` a read-only bind mount.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import cli_faults
import pytest

from pai_zoo_conformance.cli_server import CliServer

pytestmark = pytest.mark.usefixtures("fresh_registry")

TESTS = Path(__file__).resolve().parent
KINDS = ("missing", "malformed", "truncated", "tokenizer", "flag", "existing", "read-only", "full-disk", "sigkill",
         "sigint")
COMMANDS = ("list", "info", "conformance", "inspect", "convert", "preprocess", "dataset inspect", "dataset merge",
            "dataset prepare", "generate", "eval", "train", "rl reward", "rl ppo", "rl dpo", "rl grpo", "plugin new")
#: what a SIGKILLed run leaves beside its destination, and the line of the next run that removes it
TEMPORARY, REMOVED = ".pai-zoo-tmp-", "left by an interrupted run"


@dataclass
class Cell:
    """One command run. ``argv`` may hold ``{w}`` (the shared inputs), ``{c}`` (this cell's own folder, where its
    output goes), ``{full}`` and ``{ro}``; ``named`` is the text the error must contain; ``out`` the folder whose
    content must stay as it was (default ``{c}``); ``prepare(c)`` makes the cell's own inputs. For ``sigkill`` and
    ``sigint``, ``dest`` is the path whose publishing rename is interrupted (``DIR/*``: any rename into DIR;
    ``PATH@N``: the Nth rename to PATH)."""

    argv: list[str]
    named: str = ""
    code: int = 1
    out: str = "{c}"
    dest: str = ""
    prepare: object = None
    resume: str = ""  # a training run: "resumes" (the next run goes on from the saved step) or "restarts"
    env: dict = field(default_factory=dict)


def _fill(text: str, w: Path, c: Path, mounts: dict) -> str:
    return text.format(w=w, c=c, full=mounts["full"], ro=mounts["ro"])


# -- the cells' own inputs (each made in the cell's folder c from the shared inputs w) -----------------------------
def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])
    return path


def truncated_hf(c, w):
    shutil.copytree(w / "smol-hf", c / "model")
    _truncate(c / "model" / "model.safetensors")


def truncated_mcore(c, w):
    shutil.copytree(w / "smol-mcore", c / "model")
    _truncate(max((c / "model" / "release").glob("*.distcp"), key=lambda p: p.stat().st_size))


def malformed_config(c, w):
    (c / "model").mkdir()
    (c / "model" / "config.json").write_text('{"model_type": "llama",\n "hidden_size": 64,,\n}')


def dataset_copy(c, w, *, truncate: bool = False, without_bin: bool = False):
    for suffix in (".bin", ".idx", ".json"):
        if not (without_bin and suffix == ".bin"):
            shutil.copy(w / f"corpus_text_document{suffix}", c / f"data_text_document{suffix}")
    if truncate:
        _truncate(c / "data_text_document.bin")


def garbage_dataset(c, w):
    (c / "data_text_document.idx").write_bytes(b"\x01\x02not an index at all" * 4)
    (c / "data_text_document.bin").write_bytes(b"\x00" * 16)


def cut_jsonl(name):
    def make(c, w):
        lines = (w / name).read_text().splitlines()
        (c / name).write_text("\n".join(lines[:3] + [lines[3][: len(lines[3]) // 2]]))
    return make


def truncated_image(c, w):
    shutil.copy(w / "pictures.jsonl", c / "pictures.jsonl")
    for png in w.glob("*.png"):
        shutil.copy(png, c / png.name)
    _truncate(c / "red-0.png", 0.3)


def existing(*names):
    """``name/``: a folder holding a file of the user's; ``name``: a file."""
    def make(c, w):
        for name in names:
            path = c / name
            if name.endswith("/"):
                path.mkdir(parents=True)
                (path / "notes.txt").write_text("my notes\n")
            else:
                path.write_text("an older result\n")
    return make


def bad_yaml(c, w):
    (c / "run.yaml").write_text("model: [unclosed\n")


# -- the table --------------------------------------------------------------------------------------------------------
HF, MCORE, DATA, MISMATCH = "{w}/smol-hf", "{w}/smol-mcore", "{w}/corpus_text_document", "{w}/mismatch-hf"
TRAIN = ["--data", DATA, "--global-batch-size", "4", "--batch-size", "2", "--seq-length", "32", "--train-iters", "2",
         "--save-interval", "1", "--lr", "0.001", "--min-lr", "0.0001", "--no-progress"]
RL = {"rl reward": ["--data", "{w}/pairs.jsonl", "--epochs", "1", "--batch-size", "8"],
      "rl ppo": ["--reward", "rule:contains=5", "--prompts", "{w}/prompts.jsonl", "--steps", "2", "--save-every", "1",
                 "--rollout-batch-size", "2", "--mini-batch-size", "2", "--max-new-tokens", "4"],
      "rl dpo": ["--data", "{w}/pairs.jsonl", "--max-steps", "2", "--save-every", "1", "--batch-size", "2"],
      "rl grpo": ["--data", "{w}/prompts.jsonl", "--reward-funcs", "format", "--num-generations", "2",
                  "--batch-size", "2", "--steps", "2", "--save-every", "1", "--max-completion-length", "4"]}
#: the checkpoint an RL run publishes first: its SIGKILL and SIGINT cells stop it there (the reward model saves only
#: at its end or on a signal: when it logs step 1)
RL_CHECKPOINT = {"rl reward": "step=1", "rl ppo": "{c}/run/actor/iter_0000001", "rl dpo": "{c}/run/iter_0000001",
                 "rl grpo": "{c}/run/iter_0000001"}
GENERATE = ["--prompts", "{w}/prompts.jsonl", "--max-new-tokens", "2"]
PICTURES_BAD = ('{"image": "red-0.png", "conversations": [{"from": "human", "value": "<image>"}, '
                '{"from": "gpt", "value": "red"}]}\n{"image": broken\n')
EVAL = ["--data", DATA, "--seq-length", "32", "--max-tokens", "256"]
PLUGIN = ["plugin", "new", "myarch", "--from-config", "helium"]


def _writer_cells(argv, dest_flag: str | None, dest: str, *, folder: bool, resume: str = "", tail=(),
                  first: str | None = None) -> dict:
    """The existing / read-only / full-disk / SIGKILL / SIGINT cells of a command whose output is ``dest`` (in {c}),
    given by ``dest_flag`` (None: a positional argument at the end of ``argv``)."""
    def at(where):
        name = dest.replace("{c}", where)
        return [*argv, *([dest_flag, name] if dest_flag else [name]), *tail]
    first = first or dest  # the file published first (a dataset prefix: its .bin)
    published = first
    return {
        "existing": Cell(at("{c}"), named="--force", prepare=existing(
            Path(dest).name + "/" if folder else Path(first).name)),
        "read-only": Cell(at("{ro}"), named="{ro}", out="{ro}"),
        "full-disk": Cell(at("{full}"), named="{full}", out="{full}"),
        "sigkill": Cell(at("{c}"), code=-9, dest=published, resume=resume),
        "sigint": Cell(at("{c}"), code=130, dest=published, resume=resume),
    }


def table() -> dict:
    cells = {
        ("info", "missing"): Cell(["info", "{c}/nowhere"], named="{c}/nowhere"),
        ("info", "malformed"): Cell(["info", "{c}/model"], named="{c}/model/config.json", prepare=malformed_config),
        ("conformance", "missing"): Cell(["conformance", "{c}/nowhere"], named="{c}/nowhere"),
        ("inspect", "missing"): Cell(["inspect", "{c}/nowhere"], named="{c}/nowhere"),
        ("inspect", "malformed"): Cell(["inspect", "{c}/model"], named="{c}/model/config.json",
                                       prepare=malformed_config),
        ("inspect", "truncated"): Cell(["inspect", "{c}/model"], named=".distcp", prepare=truncated_mcore),
        ("inspect", "tokenizer"): Cell(["inspect", MISMATCH], named="tokenizer"),
        ("inspect", "flag"): Cell(["inspect", MCORE, "--iteration", "-3"], named="--iteration"),
        ("convert", "missing"): Cell(["convert", "{c}/nowhere", "{c}/out", "--to", "mcore"], named="{c}/nowhere"),
        ("convert", "malformed"): Cell(["convert", "{c}/model", "{c}/out", "--to", "mcore"],
                                       named="{c}/model/config.json", prepare=malformed_config),
        ("convert", "truncated"): Cell(["convert", "{c}/model", "{c}/out", "--to", "mcore"],
                                       named="{c}/model/model.safetensors", prepare=truncated_hf),
        ("convert", "flag"): Cell(["convert", HF, "{c}/out", "--to", "mcore", "--max-shard-size", "-5"],
                                  named="--max-shard-size"),
        ("preprocess", "missing"): Cell(["preprocess", "--input", "{c}/nowhere.jsonl", "--output-prefix", "{c}/out",
                                         "--tokenizer", HF], named="{c}/nowhere.jsonl"),
        ("preprocess", "malformed"): Cell(["preprocess", "--input", "{w}/bad.jsonl", "--output-prefix", "{c}/out",
                                           "--tokenizer", HF], named="{w}/bad.jsonl:2"),
        ("preprocess", "truncated"): Cell(["preprocess", "--input", "{c}/corpus.jsonl", "--output-prefix", "{c}/out",
                                           "--tokenizer", HF], named="{c}/corpus.jsonl:4",
                                          prepare=cut_jsonl("corpus.jsonl")),
        ("preprocess", "flag"): Cell(["preprocess", "--input", "{w}/corpus.jsonl", "--output-prefix", "{c}/out",
                                      "--tokenizer", HF, "--workers", "0"], named="--workers"),
        ("dataset inspect", "missing"): Cell(["dataset", "inspect", "{c}/data_text_document"],
                                             named="{c}/data_text_document.bin",
                                             prepare=lambda c, w: dataset_copy(c, w, without_bin=True)),
        ("dataset inspect", "malformed"): Cell(["dataset", "inspect", "{c}/data_text_document"],
                                               named="{c}/data_text_document.idx", prepare=garbage_dataset),
        ("dataset inspect", "truncated"): Cell(["dataset", "inspect", "{c}/data_text_document"],
                                               named="{c}/data_text_document.bin",
                                               prepare=lambda c, w: dataset_copy(c, w, truncate=True)),
        ("dataset inspect", "flag"): Cell(["dataset", "inspect", DATA, "--document", "-1"], named="--document"),
        ("dataset merge", "missing"): Cell(["dataset", "merge", DATA, "{c}/nowhere", "--output-prefix", "{c}/m"],
                                           named="{c}/nowhere"),
        ("dataset merge", "malformed"): Cell(["dataset", "merge", DATA, "{c}/data_text_document", "--output-prefix",
                                              "{c}/m"], named="{c}/data_text_document.idx", prepare=garbage_dataset),
        ("dataset merge", "truncated"): Cell(["dataset", "merge", DATA, "{c}/data_text_document", "--output-prefix",
                                              "{c}/m"], named="{c}/data_text_document.bin",
                                             prepare=lambda c, w: dataset_copy(c, w, truncate=True)),
        ("dataset prepare", "missing"): Cell(["dataset", "prepare", "{c}/nowhere.jsonl", "--output", "{c}/out"],
                                             named="{c}/nowhere.jsonl"),
        ("dataset prepare", "malformed"): Cell(["dataset", "prepare", "{w}/pictures_bad.jsonl", "--output",
                                                "{c}/out"], named="{w}/pictures_bad.jsonl:2"),
        ("dataset prepare", "truncated"): Cell(["dataset", "prepare", "{c}/pictures.jsonl", "--output", "{c}/out"],
                                               named="{c}/red-0.png", prepare=truncated_image),
        ("dataset prepare", "flag"): Cell(["dataset", "prepare", "{w}/pictures.jsonl", "--output", "{c}/out",
                                           "--samples-per-shard", "0"], named="--samples-per-shard"),
        ("generate", "missing"): Cell(["generate", "--model", "{c}/nowhere", *GENERATE, "--output", "{c}/out.jsonl"],
                                      named="{c}/nowhere"),
        ("generate", "malformed"): Cell(["generate", "--model", HF, "--prompts", "{w}/bad.jsonl",
                                         "--output", "{c}/out.jsonl"], named="{w}/bad.jsonl:2"),
        ("generate", "truncated"): Cell(["generate", "--model", "{c}/model", *GENERATE, "--output", "{c}/out.jsonl"],
                                        named="{c}/model/model.safetensors", prepare=truncated_hf),
        ("generate", "tokenizer"): Cell(["generate", "--model", MISMATCH, *GENERATE, "--output", "{c}/out.jsonl"],
                                        named="--tokenizer-mismatch-ok"),
        ("generate", "flag"): Cell(["generate", "--model", HF, *GENERATE, "--temperature", "-1"],
                                   named="--temperature"),
        ("eval", "missing"): Cell(["eval", HF, "--data", "{c}/nowhere", "--output", "{c}/out.json"],
                                  named="{c}/nowhere"),
        ("eval", "malformed"): Cell(["eval", HF, "--data", "{c}/data_text_document", "--output", "{c}/out.json"],
                                    named="{c}/data_text_document.idx", prepare=garbage_dataset),
        ("eval", "truncated"): Cell(["eval", "{c}/model", *EVAL, "--output", "{c}/out.json"], named=".distcp",
                                    prepare=truncated_mcore),
        ("eval", "tokenizer"): Cell(["eval", MISMATCH, *EVAL, "--output", "{c}/out.json"],
                                    named="--tokenizer-mismatch-ok"),
        ("eval", "flag"): Cell(["eval", HF, "--data", DATA, "--seq-length", "0"], named="--seq-length"),
        ("train", "missing"): Cell(["train", "--model", HF, *TRAIN, "--data", "{c}/nowhere", "--save", "{c}/run"],
                                   named="{c}/nowhere"),
        ("train", "malformed"): Cell(["train", "{c}/run.yaml"], named="{c}/run.yaml:2: not valid YAML",
                                     prepare=bad_yaml),
        ("train", "truncated"): Cell(["train", "--model", "{c}/model", *TRAIN, "--save", "{c}/run"],
                                     named="{c}/model/model.safetensors", prepare=truncated_hf),
        ("train", "tokenizer"): Cell(["train", "--model", MISMATCH, *TRAIN, "--save", "{c}/run"],
                                     named="--tokenizer-mismatch-ok"),
        ("train", "flag"): Cell(["train", "--model", HF, *TRAIN, "--lr", "-1", "--save", "{c}/run"], named="--lr"),
        ("plugin new", "missing"): Cell(["plugin", "new", "myarch", "--from-config", "{c}/nowhere/config.json",
                                         "--output", "{c}/out"], named="{c}/nowhere"),
        ("plugin new", "malformed"): Cell(["plugin", "new", "myarch", "--from-config", "{c}/model", "--output",
                                           "{c}/out"], named="{c}/model/config.json", prepare=malformed_config),
        ("plugin new", "flag"): Cell(["plugin", "new", "My Arch!", "--from-config", "helium", "--output", "{c}/out"],
                                     named="My Arch!"),
    }
    cells.update({("convert", kind): cell for kind, cell in
                  _writer_cells(["convert", HF], None, "{c}/out", folder=True, tail=("--to", "mcore")).items()})
    writers = {
        "preprocess": (["preprocess", "--input", "{w}/corpus.jsonl", "--tokenizer", HF], "--output-prefix", "{c}/out",
                       False, "", "{c}/out_text_document.bin"),
        "dataset merge": (["dataset", "merge", DATA, DATA], "--output-prefix", "{c}/m", False, "", "{c}/m.bin"),
        "dataset prepare": (["dataset", "prepare", "{w}/pictures.jsonl"], "--output", "{c}/out", True, "", None),
        "generate": (["generate", "--model", HF, *GENERATE], "--output", "{c}/out.jsonl", False, "", None),
        "eval": (["eval", HF, *EVAL], "--output", "{c}/out.json", False, "", None),
        "train": (["train", "--model", HF, *TRAIN], "--save", "{c}/run", True, "resumes", "{c}/run/iter_0000001"),
        "plugin new": (PLUGIN, "--output", "{c}/out", True, "", None),
    }
    for name, args in RL.items():
        model_flag = "--actor" if name == "rl ppo" else "--model"
        writers[name] = ([*name.split(), model_flag, HF, *args], "--save", "{c}/run", True,
                         "restarts" if name == "rl reward" else "resumes", RL_CHECKPOINT[name])
        cells[name, "missing"] = Cell([*name.split(), model_flag, "{c}/nowhere", *args, "--save", "{c}/run"],
                                      named="{c}/nowhere")
        cells[name, "truncated"] = Cell([*name.split(), model_flag, "{c}/model", *args, "--save", "{c}/run"],
                                        named="{c}/model/model.safetensors", prepare=truncated_hf)
        cells[name, "tokenizer"] = Cell([*name.split(), model_flag, MISMATCH, *args, "--save", "{c}/run"],
                                        named="--tokenizer-mismatch-ok")
        cells[name, "flag"] = Cell([*name.split(), model_flag, HF, *args, "--seed", "-1", "--save", "{c}/run"],
                                   named="--seed")
        data_flag = "--prompts" if name == "rl ppo" else "--data"
        bad = [*args]
        bad[bad.index(data_flag) + 1] = "{w}/bad.jsonl"
        cells[name, "malformed"] = Cell([*name.split(), model_flag, HF, *bad, "--save", "{c}/run"],
                                        named="{w}/bad.jsonl:")
    for name, (argv, flag, dest, folder, resume, first) in writers.items():
        cells.update({(name, kind): cell for kind, cell in
                      _writer_cells(argv, flag, dest, folder=folder, resume=resume, first=first).items()})
    return cells


#: the cells that cannot apply, with the reason
NOT_APPLICABLE = {
    **{("list", kind): "list reads the installed plugins only: no path, no value, no output" for kind in KINDS},
    **{("info", kind): "info reads a name or a config.json (the missing and malformed cells) and writes nothing"
       for kind in ("truncated", "tokenizer", "flag", *KINDS[5:])},
    **{("conformance", kind): "conformance takes a family name and runs the suite (pytest's own reporting); it "
                              "writes no output of its own" for kind in KINDS[1:]},
    **{(name, kind): f"{name} writes nothing" for name in ("inspect", "dataset inspect") for kind in KINDS[5:]},
    ("dataset inspect", "tokenizer"): "a dataset records token ids, not a model: there is no model to mismatch",
    ("dataset merge", "tokenizer"): "a dataset records token ids, not a model: there is no model to mismatch",
    ("dataset merge", "flag"): "dataset merge takes no value but its paths",
    ("dataset prepare", "tokenizer"): "dataset prepare copies chats and images; no tokenizer is involved",
    ("convert", "tokenizer"): "convert carries the tokenizer files as they are (inspect names a mismatch; generate, "
                              "eval and train refuse it)",
    ("preprocess", "tokenizer"): "preprocess takes a tokenizer and no model: there is nothing for it to mismatch",
    ("plugin new", "truncated"): "plugin new reads one config.json: a cut one is the malformed cell",
    ("plugin new", "tokenizer"): "plugin new reads a config, not a tokenizer",
}


# -- running the cells ------------------------------------------------------------------------------------------------
#: the server's namespace: full/ a tmpfs filled to its last block, ro/ a read-only bind mount of itself
NAMESPACE = ('mount -t tmpfs -o size=64k tmpfs "$FULL" && mount --bind "$RO" "$RO" && '
             'mount -o remount,bind,ro "$RO" && { dd if=/dev/zero of="$FULL/.filler" bs=1k 2>/dev/null; true; } && '
             'exec "$@"')


def _snapshot(server, folder: Path) -> dict:
    """What ``folder`` holds, as the commands see it (:func:`cli_faults.snapshot`): the full disk is a tmpfs mounted
    in the command server's namespace only, so it is looked at from there; any other folder from here."""
    if folder.name != "full":
        return cli_faults.snapshot(folder)
    proc = _run(server, ["--test-snapshot", str(folder)], folder)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """(server, w, mounts): the shared inputs in ``w``, and the command server in its namespace."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.fail("the full-disk and read-only cells need user and mount namespaces (unshare -rm)")
    w = tmp_path_factory.mktemp("faults")
    mounts = {"full": w / "full", "ro": w / "ro"}
    for folder in mounts.values():
        folder.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FULL": str(mounts["full"]), "RO": str(mounts["ro"]),
           "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}
    with CliServer(env=env, main="cli_faults:main", wrapper=("unshare", "-rm", "sh", "-c", NAMESPACE, "sh")) as server:
        _inputs(w, server)
        yield server, w, mounts


def _run(server, argv, cwd, env=None) -> subprocess.CompletedProcess:
    """The command, as from a terminal: Ctrl-C reaches it even where this test runs with SIGINT ignored (in the
    background, as ``make test``'s second pass does), which the command would inherit."""
    return subprocess.run([str(server.bin / "pai-zoo"), *argv], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _inputs(w: Path, server) -> None:
    """The shared inputs: a tiny Llama-shaped model (Hugging Face and Megatron-Core), corpora, chats, pairs, prompts,
    pictures, a dataset, and the same model with another model's tokenizer."""
    import numpy as np
    from PIL import Image

    import pai_zoo
    from pai_zoo.data import toy

    toy.write_tokenizer(w / "smol-hf", vocab_size=400)
    pai_zoo.load("llama3-tiny", backend="hf", vocab_size=400, tie_word_embeddings=True).model.save_pretrained(
        w / "smol-hf")
    shutil.copytree(w / "smol-hf", w / "mismatch-hf")
    toy.write_tokenizer(w / "mismatch-hf", vocab_size=1000)  # another model's: 1000 tokens for a vocabulary of 400
    toy.write_corpus(w / "corpus.jsonl", documents=40)
    (w / "bad.jsonl").write_text('{"text": "fine", "prompt": "the cat"}\n{"text": broken\n')
    (w / "pictures_bad.jsonl").write_text(PICTURES_BAD)
    with open(w / "pairs.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": "the cat", "chosen": " sees the red ball.", "rejected": " tower"}) + "\n")
    with open(w / "prompts.jsonl", "w") as f:
        for s in toy.sentences(4, seed=1):
            f.write(json.dumps({"prompt": " ".join(s.split()[:2])}) + "\n")
    with open(w / "pictures.jsonl", "w") as f:
        for i, color in enumerate(("red", "blue")):
            pixels = np.zeros((28, 28, 3), dtype="uint8")
            pixels[..., i] = 200
            Image.fromarray(pixels).save(w / f"{color}-0.png")
            f.write(json.dumps({"messages": [
                {"role": "user", "content": [{"type": "image", "image": f"{color}-0.png"},
                                             {"type": "text", "text": "Which color?"}]},
                {"role": "assistant", "content": color}]}) + "\n")
    for argv in (["convert", w / "smol-hf", w / "smol-mcore", "--to", "mcore"],
                 ["preprocess", "--input", w / "corpus.jsonl", "--output-prefix", w / "corpus", "--tokenizer",
                  w / "smol-hf", "--append-eod"]):
        proc = _run(server, [str(a) for a in argv], w)
        assert proc.returncode == 0, proc.stderr


CELLS = table()


def test_every_cell_is_decided():
    """Each subcommand x fault is a cell or has its reason: the table covers everything the issue lists."""
    decided = set(CELLS) | set(NOT_APPLICABLE)
    assert not set(CELLS) & set(NOT_APPLICABLE)
    assert decided == {(command, kind) for command in COMMANDS for kind in KINDS}
    from pai_zoo.cli import COMMANDS as CLI

    assert {name.split()[0] for name in COMMANDS} == set(CLI)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("pai-zoo: removed ")]


@pytest.mark.parametrize("cell", sorted(CELLS), ids=lambda cell: "-".join(cell).replace(" ", "-"))
def test_cell(cell, bench, tmp_path):
    server, w, mounts = bench
    spec = CELLS[cell]
    c = tmp_path
    if spec.prepare is not None:
        spec.prepare(c, w)
    fill = lambda text: _fill(text, w, c, mounts)  # noqa: E731
    argv, out = [fill(a) for a in spec.argv], Path(fill(spec.out))
    before = _snapshot(server, out)
    env = dict(spec.env)
    if spec.dest:
        env["PAI_ZOO_FAULT"] = f"{'kill' if spec.code == -9 else 'int'}:{fill(spec.dest)}"  # tests/cli_faults.py
    proc = _run(server, argv, c, env)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-4000:]
    assert proc.returncode == spec.code, text[-4000:]
    if spec.code == -9:
        _after_a_kill(server, argv, c, out, before, spec, fill)
    elif spec.code == 130:
        _after_an_interrupt(server, argv, c, out, before, spec, proc)
    else:
        lines = _error_lines(proc.stderr)
        assert lines and lines[0].startswith("pai-zoo: error: ") and fill(spec.named) in lines[0], text[-4000:]
        assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), proc.stderr
        assert _snapshot(server, out) == before, "the command changed its output folder"


def _after_a_kill(server, argv, c, out, before, spec, fill):
    """SIGKILL just before the publishing rename: the destination as it was but for the temporary beside it, which
    the next run names and removes."""
    after = _snapshot(server, out)
    left = {k for k in after if k not in before}
    if not spec.resume:
        assert {k for k in after if k in before and after[k] != before[k]} == set()
        assert left and all(TEMPORARY in k.split("/")[0] for k in left), left
    again = _run(server, argv, c)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    if not spec.resume:
        assert REMOVED in again.stderr, again.stderr
    assert not [k for k in _snapshot(server, out) if TEMPORARY in k or ".tmp" in k], _snapshot(server, out)


def _after_an_interrupt(server, argv, c, out, before, spec, proc):
    """SIGINT just before the publishing rename: nothing published, nothing left; a training run saved the step in
    progress and resumes from it."""
    assert not [k for k in _snapshot(server, out) if TEMPORARY in k or ".tmp" in k], _snapshot(server, out)
    if not spec.resume:
        assert _snapshot(server, out) == before
        return
    assert "resume" in proc.stderr, proc.stderr
    again = _run(server, argv, c)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert ("resuming" in again.stdout + again.stderr) == (spec.resume == "resumes"), again.stdout + again.stderr
