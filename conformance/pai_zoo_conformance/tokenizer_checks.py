"""The tokenizer checks: the family's test tokenizer in pai-zoo's adapter encodes and decodes like transformers'
``AutoTokenizer``, and its special tokens fit the model's config."""
from __future__ import annotations

from pathlib import Path

from pai_zoo.families.family import Family

from .cases import _fail

#: Mixed text for the tokenizer check: ASCII, CJK, emoji, whitespace runs, leading space.
MIXED_TEXT = (
    " Hello, world! The quick brown fox.\n\n  Indented\tline\t\twith tabs\n你好，世界。日本語のテキスト🙂🚀   end  "
)


def _test_tokenizers(family: Family, folder: Path):
    """The family's test tokenizer written into ``folder``: pai-zoo's adapter and transformers' AutoTokenizer."""
    from transformers import AutoTokenizer

    from pai_zoo.tokenizers.names import family_tokenizer

    if family.test_tokenizer is None:
        _fail("tokenizer", f"family {family.name!r} provides no test tokenizer (Family.test_tokenizer)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    family.test_tokenizer(folder)
    return family_tokenizer(family, folder), AutoTokenizer.from_pretrained(folder)


def check_tokenizer(family: Family, folder: Path, text: str = MIXED_TEXT) -> None:
    """The family's tokenizer adapter encodes like transformers' AutoTokenizer and decodes back."""


    ours, reference = _test_tokenizers(family, folder)
    for sample in (text, text.strip(), "a", "  "):
        got, expected = ours.encode(sample), reference(sample)["input_ids"]
        if got != expected:
            _fail("tokenizer", f"ids for {sample!r} differ from AutoTokenizer:\n  ours {got}\n  hf   {expected}")
    plain = ours.encode(text, add_special_tokens=False)
    if ours.decode(plain) != reference.decode(plain):
        _fail("tokenizer", f"decode differs from AutoTokenizer: {ours.decode(plain)!r} != {reference.decode(plain)!r}")
    # SentencePiece's dummy prefix makes a leading space unrecoverable; everything else must come back.
    body = text.lstrip(" ")
    if ours.decode(ours.encode(body, add_special_tokens=False)) != body:
        _fail(
            "tokenizer", f"decode(encode(text)) != text: {ours.decode(ours.encode(body, add_special_tokens=False))!r}"
        )


def _model_token_ids(family: Family) -> dict[str, dict[str, set]]:
    """The BOS/EOS/PAD ids the tiny preset's ``config.json`` and ``generation_config.json`` declare:
    ``{"bos": {"config.json": {1}, "generation_config.json": {1}}, ...}`` (a list of EOS ids is a set; unset
    ids are left out)."""
    from transformers import GenerationConfig

    from pai_zoo.hf import models as hf

    hf_config = hf.hf_config(family, family.presets[family.tiny])
    sources = {"config.json": hf.config_dict(hf_config)}
    try:
        sources["generation_config.json"] = GenerationConfig.from_model_config(hf_config).to_dict()
    except Exception:  # a config class transformers cannot derive a generation config from: config.json only
        pass
    declared: dict[str, dict[str, set]] = {}
    for kind in ("bos", "eos", "pad"):
        for source, values in sources.items():
            value = values.get(f"{kind}_token_id")
            if value is None:
                continue
            ids = set(value) if isinstance(value, (list, tuple)) else {value}
            declared.setdefault(kind, {})[source] = {int(i) for i in ids}
    return declared


def check_tokenizer_against_model(family: Family, folder: Path) -> None:
    """The family's test tokenizer (written into ``folder``) fits the model, in pai-zoo's adapter and in
    ``AutoTokenizer``:

    - its BOS/EOS/PAD ids are those the tiny preset's ``config.json`` and ``generation_config.json`` declare
      (EOS: one of them when they list several), wherever both sides have one;
    - when ``tokenizer_config.json`` says ``add_bos_token: true``, encoding starts with BOS;
    - every special token ``tokenizer_config.json`` declares (``added_tokens_decoder``, ``bos_token``, ...) maps
      to its declared id, in both adapters."""
    import json

    ours, reference = _test_tokenizers(family, folder)
    declared = _model_token_ids(family)
    for kind, by_source in declared.items():
        got = getattr(ours, f"{kind}_id")
        if got is None:
            continue
        for source, ids in by_source.items():
            if got not in ids:
                _fail("tokenizer", f"{kind.upper()} id {got} ({getattr(ours, f'{kind}_token')!r}) is not the "
                                   f"{kind}_token_id {sorted(ids)} of {family.tiny}'s {source}")
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if config.get("add_bos_token") is True:
        bos = ours.bos_id
        first = ours.encode("a")[:1]
        if bos is None or first != [bos]:
            _fail("tokenizer", f"tokenizer_config.json says add_bos_token, but encode('a') starts with {first} "
                               f"(BOS {ours.bos_token!r} = {bos})")
    named = {int(i): entry["content"] for i, entry in (config.get("added_tokens_decoder") or {}).items()
             if isinstance(entry, dict) and "content" in entry}
    expected = {token: i for i, token in named.items()}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            expected.setdefault(token, None)
    for token, want in expected.items():
        got, theirs = ours.token_to_id(token), reference.convert_tokens_to_ids(token)
        if got is None:
            _fail("tokenizer", f"special token {token!r} of tokenizer_config.json is not in the vocabulary")
        if want is not None and got != want:
            _fail("tokenizer", f"special token {token!r} has id {got}; tokenizer_config.json declares {want}")
        if got != theirs:
            _fail("tokenizer", f"special token {token!r} has id {got}; AutoTokenizer gives {theirs}")
