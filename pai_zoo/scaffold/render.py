"""The files of a generated plugin distribution, as text (:func:`files`)."""
from __future__ import annotations

import re
from typing import Any

from ..plugin.config_map import NORM_PLACEMENT, QK_NORM
from .draft import BIAS_ROWS, LAYERNORM_BIAS_ROWS, Draft, py
from .mechanisms import RULE_VARIANTS

#: Names the generated package may import, by the public module that exports them.
IMPORTS = {
    "pai_zoo": ("QKV", "ConfigMap", "Copy", "Family", "Field", "Fixed", "FixedIfPresent", "FusedQKV", "GateUp",
                "Require", "Rope", "Rule", "WeightMap", "hookimpl"),
    "pai_zoo.config_map": ("sliding_window",),
    "pai_zoo.layouts": ("FirstKDense", "SparseStep", "llama_config_rules", "llama_layout", "moe_config_rules",
                        "moe_layout"),
    "pai_zoo.plugin.layer_pattern": ("LayerTypes",),
    "pai_zoo.plugin.no_rope": ("NoRopeLayers", "NoRopeOnFullLayers"),
    "pai_zoo.plugin.query_scale": ("Llama4ScalingBeta",),
    "pai_zoo.testing.tokenizers": ("ByteLevelBPE",),
}
STUB = "STUB (pai-zoo plugin new)"
WIDTH = 120


def _value(value: Any, indent: int) -> str:
    """Python source of a preset value, a dict broken one key per line when it does not fit."""
    text = py(value)
    if not isinstance(value, dict) or indent + len(text) <= WIDTH:
        return text
    pad = " " * (indent + 4)
    items = "".join(f"{pad}{py(k)}: {_value(v, indent + 4)},\n" for k, v in value.items())
    return "{\n" + items + " " * indent + "}"


def _isort(name: str) -> tuple:
    """isort's order by type: constants, classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def _imports(body: str) -> str:
    lines = []
    for module, names in IMPORTS.items():
        used = [n for n in names if re.search(rf"(?<![\w\"]){n}\b(?!\")", body)]  # not a quoted key
        if used:
            lines.append(f"from {module} import {', '.join(sorted(used, key=_isort))}")
    return "\n".join(lines)


def comment_lines(text: str, first: str, rest: str) -> list[str]:
    """``text`` as comment lines of at most :data:`WIDTH` characters (``first`` / ``rest`` start them)."""
    lines, line = [], first + text
    while len(line) > WIDTH and line.rfind(" ", len(rest), WIDTH) > len(rest):
        cut = line.rfind(" ", len(rest), WIDTH)
        lines.append(line[:cut])
        line = rest + line[cut + 1:]
    return lines + [line]


def _dict_block(values: dict[str, Any], comments: dict[str, str], indent: int) -> str:
    pad = " " * (indent + 4)
    out = []
    for key, value in values.items():
        if comments.get(key):
            out += comment_lines(comments[key], pad + "# ", pad + "# ")
        out.append(f"{pad}{py(key)}: {py(value)},")
    return "{\n" + "\n".join(out) + "\n" + " " * indent + "}"


def _arch_variants(draft: Draft) -> dict:
    return {k: v for k, v in draft.variants.items() if not k.startswith("rule:")}


def _rule_variants(draft: Draft) -> list[str]:
    return [k[len("rule:"):] for k in draft.variants if k.startswith("rule:")]


def _rules(draft: Draft) -> list[tuple[str, str]]:
    """The family rules, then the rules measurement found."""
    found = [(f"{name}()", "found by measurement") for name in _rule_variants(draft)]
    return list(draft.family_rules) + found


def rule_classes(draft: Draft) -> str:
    names = [name for name in _rule_variants(draft) if RULE_VARIANTS[name][0]]  # "": the core's, imported
    return "".join(("\n" if i == 0 else "") + RULE_VARIANTS[name][0] + "\n\n" for i, name in enumerate(names))


def _split_args(text: str) -> list[str]:
    """The top-level comma-separated arguments of a call's argument text (quotes and brackets respected)."""
    out, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote and text[i - 1] != "\\" else quote
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    return out + ([text[start:].strip()] if text[start:].strip() else [])


def rule_line(code: str, comment: str, indent: int) -> str:
    """A rule's source as one argument line at ``indent`` (with its comment where it fits), or, when too long for
    :data:`WIDTH`, broken after its opening parenthesis with the arguments packed on the lines below."""
    pad = " " * indent
    line = f"{pad}{code},"
    if comment and len(line) + len(comment) + 4 <= WIDTH:
        return f"{line}  # {comment}"
    if len(line) <= WIDTH or "\n" in code or not code.endswith(")") or "(" not in code:
        return line
    head, args = code[:code.index("(") + 1], _split_args(code[code.index("(") + 1:-1])
    lines, current = [pad + head], pad + "    "
    for arg in args:
        if len(current) + len(arg) + 2 > WIDTH and current.strip():
            lines.append(current.rstrip())
            current = pad + "    "
        current += arg + ", "
    lines.append(current.rstrip())
    return "\n".join(lines) + f"\n{pad}),"


def config_code(draft: Draft) -> str:
    args = []
    for code, comment in _rules(draft):
        args.append(rule_line(code, comment, 8))
    for key, value in draft.llama_kwargs.items():
        args.append(f"        {key}={py(value)},")
    if draft.hf_fixed:
        args.append(f"        hf_fixed={_dict_block(draft.hf_fixed, draft.notes, 8)},")
    mcore = {**draft.mcore_fixed, **_arch_variants(draft)}
    if mcore:
        comments = {k: draft.variant_notes.get(k, "") for k in _arch_variants(draft)}
        args.append(f"        mcore_fixed={_dict_block(mcore, comments, 8)},")
    passthrough = ""
    if draft.passthrough:
        passthrough = f"    passthrough={py(tuple(draft.passthrough))},  # as the installed families pass them\n"
    if draft.eps_key == "rms_norm_eps":
        return "CONFIG = ConfigMap(\n    *llama_config_rules(\n" + "\n".join(args) + "\n    ),\n" + passthrough + ")\n"
    return _explicit_config(draft, passthrough)


def _explicit_config(draft: Draft, passthrough: str) -> str:
    """The rules of :func:`pai_zoo.layouts.llama_config_rules` written out, for a config whose norm epsilon key is
    another than ``rms_norm_eps``."""
    kw = draft.llama_kwargs
    shape = [("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("intermediate_size", "ffn_hidden_size"),
             ("num_hidden_layers", "num_layers"), ("num_attention_heads", "num_attention_heads")]
    lines = [f"    Field({py(h)}, {py(m)})," for h, m in shape]
    if kw.get("gqa", True):
        lines.append('    Field("num_key_value_heads", "num_query_groups"),')
        lines.append('    Field("head_dim", "kv_channels"' + (", default=None)," if "head_dim" in kw else "),"))
    lines.append('    Field("max_position_embeddings", "max_sequence_length"),')
    lines.append(f'    Field({py(draft.eps_key)}, "layernorm_epsilon"),  # the norm epsilon key of this config')
    tie = kw["tie_default"]
    lines.append(f'    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default={tie!r}),')
    for code, comment in _rules(draft):
        lines.append(rule_line(code.replace("\n        ", "\n    "), comment, 4))
    act = draft.hf_fixed.get("hidden_act", "silu")
    hf_fixed = {"hidden_act": act, **{k: v for k, v in draft.hf_fixed.items() if k != "hidden_act"}}
    mcore = {"gated_linear_unit": True, "activation_func": "silu", "normalization": "RMSNorm", **draft.mcore_fixed,
             **_arch_variants(draft)}
    comments = {k: draft.variant_notes.get(k, "") for k in _arch_variants(draft)}
    lines.append(f"    Fixed(\n        hf={_dict_block(hf_fixed, draft.notes, 8)},\n"
                 f"        mcore={_dict_block(mcore, comments, 8)},\n    ),")
    return "CONFIG = ConfigMap(\n" + "\n".join(lines) + "\n" + passthrough + ")\n"


def weights_code(draft: Draft) -> str:
    doc = "The Llama layout's table" + (" (" + "; ".join(draft.found) + ")" if draft.found else "") + \
        "; bias rows where the config switches them on."
    lines = ["def weights(config) -> WeightMap:"]
    lines += comment_lines(doc, '    """', "    ")
    lines[-1] += '"""'
    if draft.layout_kwargs:
        lines.append("    rows = llama_layout(")
        lines += [f"        {k}={v}," for k, v in draft.layout_kwargs.items()]
        lines.append("    )")
    else:
        lines.append("    rows = llama_layout()")
    if draft.drop_rows:
        parts = py(tuple(draft.drop_rows))
        lines.append("    rows = [r for r in rows")
        lines.append(f"            if not any(part in name for name in r.hf for part in {parts})]")
    if draft.extra_rows:
        lines.append("    rows += [")
        lines += [f"        {r}," for r in draft.extra_rows]
        lines.append("    ]")
    if draft.layernorm:
        lines.append("    rows += [  # LayerNorms with biases")
        lines += [f"        {r}," for r in LAYERNORM_BIAS_ROWS]
        lines.append("    ]")
    for switch in draft.bias_switches:
        rows = BIAS_ROWS[switch]
        lines.append(f"    if config.get({py(switch)}):")
        if len(rows) == 1:
            lines.append(f"        rows.append({rows[0]})")
        else:
            lines.append("        rows += [")
            lines += [f"            {r}," for r in rows]
            lines.append("        ]")
    lines.append("    return WeightMap(*rows)")
    return "\n".join(lines) + "\n"


def stubs_code(draft: Draft) -> str:
    if not draft.stubs:
        return ""
    lines = [f"# {STUB}: not explained by the config keys, the parameter names or measurement. The conformance",
             "# suite fails on each until it is written by hand (docs/writing-a-plugin.md):"]
    for stub in draft.stubs:
        lines += comment_lines(stub, "#   - ", "#     ")
    return "\n".join(lines) + "\n\n"


def package_init(draft: Draft) -> str:
    src = draft.source
    found = ""
    if draft.variants:
        found = " What the keys and names cannot show was measured against transformers on the same random " \
                f"weights: {', '.join(f'{k}={v!r}' for k, v in draft.variants.items())}."
    doc = (f'"""pai-zoo plugin for {src.architecture} (model_type {src.model_type!r}), generated by '
           f"`pai-zoo plugin new` from {src.where}.\n\nThe config rules come from the config's keys, the weight table "
           f"from the model's parameter names.{found}\n" + ('"""' if not draft.stubs else
                                                            f"It has stubs ({STUB}): see below.\n\"\"\""))
    doc = _wrap_doc(doc)
    body = (
        rule_classes(draft) + config_code(draft) + "\n" + stubs_code(draft)
        + (LAYER_PREFIXES if draft.bias_switches or draft.layernorm or draft.layout_kwargs or draft.extra_rows
           else "") + weights_code(draft)
        + "\n\n" + TOKENIZER + "\n" + family_code(draft) + "\n\n@hookimpl\ndef pai_zoo_families():\n"
        "    return [FAMILY]\n"
    )
    head = doc + "\nfrom __future__ import annotations\n\n" + _imports(body) + "\n\nfrom .presets import PRESETS\n\n"
    return head + body


def _wrap_doc(text: str) -> str:
    out = []
    for line in text.split("\n"):
        while len(line) > WIDTH:
            cut = line.rfind(" ", 0, WIDTH)
            out.append(line[:cut])
            line = line[cut + 1:]
        out.append(line)
    return "\n".join(out)


#: The per-layer name prefixes of the Llama layout (transformers, megatron-core), as the bias rows use them.
LAYER_PREFIXES = 'L, M = "model.layers.{layer}.", "decoder.layers.{layer}."\n\n\n'

TOKENIZER = '''#: The test tokenizer (the suite's tokenizer checks; the test presets' tokenizer): a byte-level BPE whose
#: <unk>, <s>, </s>, <pad> are ids 0-3, the test presets' token ids; BOS is put before every text.
write_test_tokenizer = ByteLevelBPE(
    special_tokens=("<unk>", "<s>", "</s>", "<pad>"),
    prefix=("<s>",),
    config={"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<pad>", "clean_up_tokenization_spaces": False},
)
'''


def family_code(draft: Draft) -> str:
    src = draft.source
    return (
        "FAMILY = Family(\n"
        f"    name={py(draft.name)},\n"
        f"    hf_architectures=({py(src.architecture)},),\n"
        f"    model_types=({py(src.model_type)},),\n"
        "    presets=PRESETS,\n"
        f"    tiny={py(draft.tiny)},\n"
        f"    odd={py(draft.odd)},\n"
        "    config_map=CONFIG,\n"
        "    weight_map=weights,\n"
        "    test_tokenizer=write_test_tokenizer,\n"
        + ('    backends=("local",),  # pai-zoo\'s own modules (norm placement, q/k norms): the local spec\n'
           if any(k in draft.mcore_fixed for k in (NORM_PLACEMENT, QK_NORM)) else "")
        + f"    description={py(src.architecture + ' (generated by pai-zoo plugin new)')},\n"
        ")\n"
    )


def presets_module(draft: Draft) -> str:
    presets = draft.presets()
    lines = [f'"""Hugging Face configs of {draft.source.architecture}: {draft.published} (from {draft.source.where})',
             'and the two test sizes of the conformance suite (tiny: every check; odd: unusual shapes)."""', "",
             "PRESETS = {"]
    for name, values in presets.items():
        lines.append(f"    {py(name)}: {{")
        lines += [f"        {py(k)}: {_value(v, 8)}," for k, v in values.items()]
        lines.append("    },")
    lines.append("}")
    return _wrap_doc("\n".join(lines)) + "\n"


def pyproject(draft: Draft) -> str:
    return f'''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{draft.distribution}"
version = "0.1.0"
description = "pai-zoo plugin: {draft.source.architecture} on Megatron-Core (generated by pai-zoo plugin new)"
requires-python = ">=3.10"
dependencies = ["pai-zoo"]

[project.optional-dependencies]
test = ["pai-zoo-conformance", "pytest"]

[project.entry-points.pai_zoo]
{draft.name} = "{draft.package}"

[tool.setuptools.packages.find]
include = ["{draft.package}*"]
'''


def conformance_test(draft: Draft) -> str:
    cls = "".join(p.capitalize() for p in re.split(r"[-_.]", draft.name) if p)
    return (f'"""The shared conformance suite on {draft.source.architecture}."""\n'
            "from pai_zoo_conformance import ConformanceSuite\n\n\n"
            f"class Test{cls}Conformance(ConformanceSuite):\n    family = {py(draft.name)}\n")


def readme(draft: Draft) -> str:
    src = draft.source
    deltas = ", ".join(f"{p} {d:.2g}" for p, d in draft.measured.items()) or "not measured"
    variants = "\n".join(f"  - `{k}: {v!r}`: {draft.variant_notes.get(k, '').removeprefix('found by measurement: ')}"
                         for k, v in draft.variants.items())
    stubs = "\n".join(f"- {s}" for s in draft.stubs)
    odd_head_dim = draft.odd_shape.get("head_dim") if "head_dim" in draft.hf else "hidden / heads"
    if draft.odd_note:
        odd_head_dim = f"{odd_head_dim} ({draft.odd_note})"
    return f"""# {draft.distribution}

A pai-zoo plugin for `{src.architecture}` (transformers `model_type` `{src.model_type}`), generated by
`pai-zoo plugin new {draft.name} --from-config ...` from {src.where}.

```bash
pip install -e .            # registers the family `{draft.name}` (entry point group `pai_zoo`)
pai-zoo info {draft.name}
pai-zoo conformance {draft.name}
```

## Presets

| preset | what |
|---|---|
| `{draft.tiny}` | every conformance check (2 layers, hidden 64, 4 heads / 2 KV heads, vocab 1000) |
| `{draft.odd}` | unusual shapes: 6 heads / 2 KV heads, vocab 1001, every bias switch on, head_dim {odd_head_dim} |
| `{draft.published}` | the source config ({src.where}); its values are not checked against a published checkpoint |

## How it was inferred

- Config rules: the Llama layout's rules (`pai_zoo.layouts.llama_config_rules`), and for the other keys the rules
  of the installed families and the bias switches found by building the model on the meta device.
- Weight table: `pai_zoo.layouts.llama_layout()` and the bias rows the config switches on.
- Measured on the same random weights (max |logits delta| vs transformers, float32): {deltas}.
{("- Found by measurement:" + chr(10) + variants) if variants else "- Nothing needed measurement beyond the keys."}

{("## Stubs" + chr(10) + chr(10) + "Not explained; the conformance suite fails on each:" + chr(10) + chr(10) + stubs)
 if stubs else "## Stubs" + chr(10) + chr(10) + "None: the plugin passed the forward check when it was generated."}

The test tokenizer is a small byte-level BPE (`pai_zoo.testing.tokenizers.ByteLevelBPE`), not the model's own.
"""
