"""``pai-zoo preprocess``: tokenize text (or, with ``--sft``, chat records) into indexed datasets."""
from __future__ import annotations

import glob
import sys

from ..data.preprocess import output_prefix, preprocess, preprocess_sft
from ..util.outputs import check_dataset_outputs
from ._checks import check_inputs
from ._common import add_command, defaults, hub_args


def add_parser(subparsers) -> None:
    plain, sft = defaults(preprocess), defaults(preprocess_sft)
    p = add_command(subparsers, "preprocess", "tokenize text into Megatron indexed datasets (.bin/.idx)")
    p.add_argument("--input", nargs="+", required=True, help="JSON Lines (.jsonl[.gz|.zst]) or text files, or globs")
    p.add_argument("--output-prefix", required=True,
                   help="writes PREFIX_{key}_document.bin/.idx (train --data and dataset take PREFIX or "
                        "PREFIX_text_document)")
    p.add_argument("--tokenizer", required=True, help="checkpoint folder, tokenizer file, family or preset, or a "
                                                         "Hugging Face Hub id (org/name)")
    p.add_argument("--json-keys", nargs="+", default=list(plain["json_keys"]),
                   help="keys to tokenize (one dataset each)")
    p.add_argument("--append-eod", action="store_true", help="end every document with the end-of-document token")
    p.add_argument("--no-special-tokens", action="store_true", help="do not let the tokenizer add BOS/EOS")
    p.add_argument("--text-mode", choices=("file", "paragraph"), default=plain["text_mode"],
                   help="plain-text inputs: one document per file or per blank-line paragraph")
    p.add_argument("--engine", choices=("auto", "fast", "hf"), default=plain["engine"],
                   help="auto: the fast engine (gigatoken) when installed and it gives transformers' ids on a "
                        "sample of the input, else hf; fast: that or an error; hf: tokenizers/sentencepiece/tiktoken")
    p.add_argument("--workers", type=int, default=plain["workers"],
                   help="tokenizer processes (hf engine) or threads (fast engine)")
    p.add_argument("--batch-size", type=int, default=plain["batch_size"], help="records per worker task")
    p.add_argument("--skip-bad", action="store_true", help="skip and count bad records instead of stopping")
    p.add_argument("--sft", action="store_true", help="instruction/chat records: tokens + loss mask, packed")
    p.add_argument("--seq-length", type=int, default=sft["seq_length"], help="--sft: tokens per packed sequence")
    p.add_argument("--pad-length", type=int, default=sft["pad_length"],
                   help="--sft --no-pack: pad each record to a multiple")
    p.add_argument("--no-pack", action="store_true", help="--sft: one record per sequence, padded")
    p.add_argument("--force", action="store_true", help="replace the datasets at --output-prefix if they exist")
    p.set_defaults(func=run)


def run(args) -> int:
    hub_args(args)  # a Hub id --tokenizer: its tokenizer files in the Hugging Face cache
    check_inputs(*((path, "--input") for path in args.input if not glob.has_magic(path)))  # before the tokenizer
    keys = ("text", "loss_mask") if args.sft else tuple(args.json_keys)
    if all(key and not any(bad in key for bad in ("/", "\\", "..", "\0")) for key in keys):  # else refused below
        # exist without --force, not writable: refused before the tokenizer loads; a killed run's temporaries go
        check_dataset_outputs([output_prefix(args.output_prefix, key) for key in keys], force=args.force)
    common = dict(workers=args.workers, skip_bad=args.skip_bad, batch_size=args.batch_size, progress=None)
    if args.sft:
        summary = preprocess_sft(args.input, args.output_prefix, args.tokenizer, seq_length=args.seq_length,
                                 pad_length=args.pad_length, pack=not args.no_pack, **common)
    else:
        summary = preprocess(args.input, args.output_prefix, args.tokenizer, json_keys=args.json_keys,
                             append_eod=args.append_eod, text_mode=args.text_mode,
                             add_special_tokens=not args.no_special_tokens, engine=args.engine, **common)
    for example in summary.skipped_examples:
        print(f"skipped: {example}", file=sys.stderr)
    print(summary.line())
    return 0
