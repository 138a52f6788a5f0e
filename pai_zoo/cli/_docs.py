"""``docs/configuration.md``, generated from the settings dataclasses: :class:`~pai_zoo.training.config.TrainConfig`
(with :data:`~pai_zoo.training.config.SETTINGS`, its flags, Megatron-LM's names and meanings) and
:class:`~pai_zoo.generation.SamplingParams`. ``tests/test_configuration_docs.py`` fails when the committed file and
the dataclasses drift apart; regenerate it with ``python -m pai_zoo.cli._docs > docs/configuration.md``.
(``pai-zoo rl`` has no settings dataclass: its flags are in ``pai-zoo rl NAME --help``.)
"""
from __future__ import annotations

import dataclasses

from ..generation import SamplingParams
from ..training.config import DECAY_STYLES, DEFAULT_WARMUP_FRACTION, SETTINGS, TrainConfig, aliases

#: The worked YAML examples (``pai-zoo train EXAMPLE.yaml``); the test loads each with ``TrainConfig.load``.
EXAMPLES = {
    "Continued pretraining": (
        "Continue pretraining a Hugging Face model on a blend of two corpora, 2,000 steps of 64 x 2048 tokens, "
        "on 8 GPUs as TP 2 x DP 4 (`torchrun --nproc-per-node 8 -m pai_zoo.cli train cpt.yaml`). Megatron-LM's "
        "names (`micro_batch_size`, `lr`, `lr_warmup_fraction`, `tensor_model_parallel_size`) and pai-zoo's "
        "may be mixed.",
        """\
model: models/SmolLM2-135M          # HF folder, preset or Megatron checkpoint (Megatron-LM: load)
data: [0.7, data/books_text_document, 0.3, data/web_text_document]   # WEIGHT PREFIX ... (data_path)
save: runs/cpt
seq_length: 2048
micro_batch_size: 4
global_batch_size: 64
train_iters: 2000                   # or train_tokens: 262144000
lr: 3.0e-4
min_lr: 3.0e-5
lr_decay_style: cosine
lr_warmup_fraction: 0.05            # 100 steps
weight_decay: 0.1
clip_grad: 1.0
tensor_model_parallel_size: 2
bf16: true
save_interval: 500
keep_last: 2
eval_interval: 200
eval_iters: 10
""",
    ),
    "SFT": (
        "Supervised fine-tuning on chat records preprocessed with `pai-zoo preprocess --sft`, the budget in "
        "tokens and the warm-up in steps, weights-only checkpoints.",
        """\
model: runs/cpt                     # the continued-pretraining run above
data: data/chat                     # preprocess --sft output prefix
save: runs/sft
sft: true
sequence_length: 2048
pad_length: 128
batch_size: 1
global_batch_size: 32
train_tokens: 13107200              # 200 steps of 32 x 2048 tokens
warmup_iters: 10
learning_rate: 1.0e-5
min_learning_rate: 1.0e-6
lr_decay_style: linear
save_interval: 100
no_save_optim: true                 # or save_optim: false
""",
    ),
}

#: SamplingParams field -> (the ``pai-zoo generate`` flag or None, its meaning)
SAMPLING = {
    "max_new_tokens": ("--max-new-tokens", "the most tokens generated per prompt"),
    "temperature": ("--temperature", "0: greedy (argmax); otherwise the logits are divided by it before sampling"),
    "top_k": ("--top-k", "sample among the k most likely tokens (0: all)"),
    "top_p": ("--top-p", "sample among the smallest set of tokens whose probability reaches p (1.0: all)"),
    "seed": ("--seed", "seed of the sampling generator (none: torch's global generator)"),
    "stop": ("--stop", "strings that end a completion (the text is cut before them)"),
    "eos_token_id": (None, "token ids that end a completion (empty: the model's EOS)"),
}


def _value(value) -> str:
    if value is None or value == () or value == "" or value == []:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _train_table() -> list[str]:
    others: dict[str, list[str]] = {}
    for key, (name, negated) in aliases().items():
        if key != name:
            others.setdefault(name, []).append(f"`{key}`" + (" (negated)" if negated else ""))
    required = {"model", "data", "save"}
    rows = ["| key | also accepted as a key | flag | Megatron-LM | default | meaning |",
            "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(TrainConfig):
        setting = SETTINGS[f.name]
        default = "required" if f.name in required else _value(_default(f))
        if f.name == "progress":
            default = "on a terminal"
        rows.append(f"| `{f.name}` | {', '.join(others.get(f.name, [])) or '—'} | "
                    f"{', '.join(f'`{flag}`' for flag in setting.flags)} | "
                    f"{f'`{setting.megatron}`' if setting.megatron else '—'} | {default} | {setting.help} |")
    return rows


def _sampling_table() -> list[str]:
    rows = ["| field | flag | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(SamplingParams):
        flag, text = SAMPLING[f.name]
        rows.append(f"| `{f.name}` | {f'`{flag}`' if flag else 'Python only'} | {_value(_default(f))} | {text} |")
    return rows


def configuration_markdown() -> str:
    """The text of ``docs/configuration.md``."""

    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m pai_zoo.cli._docs > docs/configuration.md` from the settings dataclasses "
        "(pai_zoo.training.config.TrainConfig and SETTINGS, pai_zoo.generation.SamplingParams); "
        "tests/test_configuration_docs.py fails when they drift apart. Do not edit by hand. -->",
        "",
        "## `pai-zoo train`",
        "",
        "`pai-zoo train [CONFIG.yaml] [flags]` reads its settings from an optional YAML file, with the flags on top "
        "(a flag overrides the file, which overrides the defaults). Every setting has a YAML key (the field name) "
        "and a flag; the file also accepts each flag's name without its dashes as a key (`lr`, `micro_batch_size`, "
        "`data_path`, `load`, `lr_warmup_iters`; `-` or `_` alike), and the command line accepts Megatron-LM's "
        "flag names beside pai-zoo's. Giving one setting twice in one place (`lr` and `learning_rate`) is an error.",
        "",
        "**Budget and warm-up.** The budget is given in tokens (`train_tokens`; steps = tokens // (global batch x "
        "sequence length)) or in steps (`train_iters`), the warm-up in tokens (`warmup_tokens`), in steps "
        "(`warmup_iters`) or as a fraction of the run's steps (`warmup_fraction`). Giving two forms of one in the "
        "same place is an error; a flag replaces the YAML file's other forms of the same setting. Without a "
        f"warm-up setting the warm-up is `warmup_fraction` = {DEFAULT_WARMUP_FRACTION} of the run's steps, rounded "
        "down (5 of the default 50 steps, the PAI recipe's 163,840 tokens), so a short run never fails for its "
        "default warm-up. A warm-up as long as the run or longer is refused before any work starts, naming the flag "
        "or key that was given. After the warm-up the learning rate decays by `lr_decay_style` "
        f"({', '.join(DECAY_STYLES)}) from `learning_rate` to `min_learning_rate` at the last step.",
        "",
        *_train_table(),
        "",
    ]
    for title, (text, yaml_text) in EXAMPLES.items():
        lines += [f"### Example: {title.lower()}", "", text, "", "```yaml", yaml_text.rstrip("\n"), "```", ""]
    lines += [
        "## Generation: `pai-zoo generate` and `SamplingParams`",
        "",
        "`pai-zoo generate` takes these as flags; in Python they are the keyword arguments of "
        "`handle.generate(prompts, max_new_tokens=..., temperature=...)` and the fields of "
        "`pai_zoo.generation.SamplingParams`.",
        "",
        *_sampling_table(),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(configuration_markdown(), end="")
