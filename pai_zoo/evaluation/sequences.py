"""The token sequences ``pai-zoo eval --data`` scores, one dataset at a time.

A dataset is a ``.bin``/``.idx`` prefix (``PREFIX`` or ``PREFIX_text_document``) or a JSON Lines file, which is
tokenized first, as ``pai-zoo preprocess --append-eod`` would (the model's tokenizer, its special tokens, an EOD
after each document), into a scratch folder that is removed afterwards.

Two packings (``--packing``):

- ``megatron`` (the default): Megatron's sample packing, as ``pai-zoo train`` reads data: megatron-core's own
  ``GPTDataset`` (documents shuffled with ``--seed``, concatenated and cut into samples of ``seq_length + 1``
  tokens that cross document boundaries, one epoch). With ``--split TRAIN,VALID,TEST`` it is the validation part of
  that split, the samples ``train --split ... --eval-interval`` evaluates (its first evaluation reads the first
  ``eval_iters x global_batch_size`` of them); without, every document. Each sample scores ``seq_length`` tokens.
- ``document``: one document per sequence; a document longer than ``seq_length + 1`` tokens is cut into windows
  of ``seq_length + 1`` tokens that overlap by one, so every token after a document's first is scored once.

Megatron-core is imported only to build the packed samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.prefix import resolve_prefix
from ..data.preprocess import NoEndOfDocument, output_prefix, preprocess
from ..data.sources import is_json_lines
from ..data.vocabulary import check_dataset_vocabulary
from ..plugin.errors import DataError, VocabularyMismatchError

#: ``--packing`` choices: what each one does (``pai-zoo eval --help``)
PACKINGS = {
    "megatron": "Megatron's sample packing, as in training (GPTDataset: shuffled documents cut into samples of "
                "seq-length + 1 tokens across document boundaries)",
    "document": "one document per sequence (longer documents in windows of seq-length + 1 tokens)",
}
DEFAULT_PACKING = "megatron"
#: the split that puts every document in the validation part
ALL_DOCUMENTS = "0,1,0"


@dataclass
class Sequences:
    """A dataset's sequences: ``rows[i]`` is a 1-D int64 array of ``n + 1`` tokens that scores ``n`` of them."""

    given: str  # the --data value as the user gave it
    prefix: str  # the indexed dataset read
    rows: object  # a sequence of numpy arrays (a GPTDataset view for the megatron packing)
    documents: int

    def __len__(self) -> int:
        return len(self.rows)


def dataset_prefix(given: str, tokenizer: str | None, scratch: Path, index: int) -> str:
    """The indexed dataset ``given`` names; a JSON Lines file is tokenized into ``scratch`` first (``tokenizer``:
    a folder or name :func:`pai_zoo.data.preprocess.preprocess` takes)."""
    path = Path(given)
    if path.is_file() and is_json_lines(path):
        if tokenizer is None:
            raise DataError(f"--data {given}: a JSON Lines file is tokenized with the model's tokenizer, and this "
                            "model has none; preprocess it first (pai-zoo preprocess --tokenizer ...)")
        out = scratch / f"data{index}"
        try:
            preprocess([path], out, tokenizer, append_eod=True, progress=False)
        except NoEndOfDocument as exc:
            raise DataError(f"--data {given}: the tokenizer {tokenizer} has no end-of-document token to put after "
                            "each document", hint="preprocess the file yourself (pai-zoo preprocess, without "
                            "--append-eod) and give eval the prefix") from exc
        return output_prefix(out, "text")
    return str(resolve_prefix(given, what="--data", first=".bin"))


def read_sequences(given: str, prefix: str, *, seq_length: int, packing: str, vocab_size: int, eod: int,
                   seed: int, split: str | None, cache: Path, model: str | None = None,
                   tokenizer: str | None = None) -> Sequences:
    """The sequences of one dataset (see the module docstring); ids outside the vocabulary and a dataset with
    nothing to score are refused in one line (a JSON Lines file's, naming the file and ``tokenizer``, eval's
    ``--tokenizer`` if given, never the scratch prefix it was tokenized into)."""
    from ..data.indexed import IndexedDatasetReader

    if prefix != given and Path(given).is_file():
        _check_tokenized_jsonl(given, prefix, vocab_size, tokenizer)
    else:
        check_dataset_vocabulary(prefix, vocab_size, model)
    with IndexedDatasetReader(prefix) as reader:
        documents, tokens = reader.num_documents, reader.num_tokens
        rows = _documents(reader, seq_length) if packing == "document" else None
    if packing == "megatron":
        rows = _packed(prefix, seq_length, seed, split or ALL_DOCUMENTS, vocab_size, eod, cache)
    if not len(rows):
        part = f" in the validation part of split {split}" if split else ""
        if packing == "megatron":
            need, fix = f"at least {seq_length + 1} tokens", "use --packing document or a smaller --seq-length"
        else:
            need, fix = "a document of 2 tokens or more", "give a dataset with documents"
        raise DataError(f"--data {given}: nothing to evaluate{part} ({documents} documents, {tokens} tokens; "
                        f"--packing {packing} with --seq-length {seq_length} needs {need}); {fix}")
    return Sequences(given, prefix, rows, documents)


def _check_tokenized_jsonl(given: str, prefix: str, vocab_size: int, tokenizer: str | None) -> None:
    """A JSON Lines file eval tokenized: its ids against the model's vocabulary, the error naming the file."""
    from ..data.indexed import read_sidecar, token_id_range

    found = token_id_range(prefix)
    if found is None or (0 <= found[0] and found[1] < vocab_size):
        return
    used = ((read_sidecar(prefix) or {}).get("tokenizer") or {})
    size = used.get("vocab_size") if isinstance(used, dict) else None
    tokens = f" ({size} tokens)" if size else ""
    if tokenizer is not None:
        what = f"--tokenizer {tokenizer}{tokens}"
        fix = "leave out --tokenizer (the model's own tokenizer) or give the folder of the model's tokenizer"
    else:
        what = f"the model's tokenizer{tokens}"
        fix = "give eval --tokenizer with the folder of the tokenizer the model was trained with"
    raise VocabularyMismatchError(
        f"--data {given}: tokenized with {what}, its token ids reach {found[1]}, outside the model's vocabulary "
        f"[0, {vocab_size}): the tokenizer does not belong to the model; {fix}")


def _documents(reader, seq_length: int) -> list:
    import numpy as np

    rows = []
    for j in range(reader.num_documents):
        doc = reader.document(j).astype(np.int64)
        for start in range(0, max(len(doc) - 1, 0), seq_length):
            window = doc[start : start + seq_length + 1]
            if len(window) >= 2:
                rows.append(window)
    return rows


class _PackedRows:
    """A megatron ``GPTDataset`` as rows of ``seq_length + 1`` tokens (its tokens plus the last label)."""

    def __init__(self, dataset, row_length: int):
        self.dataset, self.row_length = dataset, row_length

    def __len__(self) -> int:
        return 0 if self.dataset is None else len(self.dataset)

    def __getitem__(self, i: int):
        import numpy as np

        item = self.dataset[i]
        return np.concatenate([item["tokens"].numpy(), item["labels"][-1:].numpy()]).astype(np.int64)


def _packed(prefix: str, seq_length: int, seed: int, split: str, vocab_size: int, eod: int, cache: Path):
    import warnings

    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from ..training.data import DatasetTokenizer

    # The settings pai-zoo train gives megatron-core (pai_zoo.training.data.build_pretraining_datasets): the same
    # seed, sequence length and split make the same samples in the same order.
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([prefix], None), split=split,
        path_to_cache=str(cache), tokenizer=DatasetTokenizer(vocab_size, eod),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()
    return _PackedRows(valid, seq_length + 1)
