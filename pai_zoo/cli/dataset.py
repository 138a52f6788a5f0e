"""``pai-zoo dataset inspect PREFIX``, ``pai-zoo dataset merge PREFIX... --output-prefix OUT`` and ``pai-zoo dataset
prepare FILE.jsonl --output DIR`` (vision SFT data as megatron-energon shards)."""
from __future__ import annotations

from ..data.prefix import resolve_prefix
from ..plugin.errors import PaiZooError
from ..tokenizers.names import resolve_tokenizer
from ..util.outputs import check_dataset_outputs, check_output
from ._checks import check_inputs
from ._common import add_command, hub_args


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "dataset", "inspect or merge indexed datasets")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    q = add_command(dsub, "inspect", "counts and token statistics; decode a document")
    q.add_argument("prefix", help="PREFIX of PREFIX.bin/PREFIX.idx, or of PREFIX_text_document.bin/.idx")
    q.add_argument("--document", type=int, help="show this document")
    q.add_argument("--tokenizer", help="decode the document with this tokenizer")
    q.add_argument("--full", action="store_true",
                   help="read every token for the token-id range (default: the sidecar's, when it matches the files)")
    q.set_defaults(func=run_inspect)
    q = add_command(dsub, "merge", "concatenate datasets")
    q.add_argument("prefixes", nargs="+", help="PREFIX of each input PREFIX.bin/PREFIX.idx (or PREFIX_text_document)")
    q.add_argument("--output-prefix", required=True, help="writes OUT.bin/OUT.idx (must not exist unless --force)")
    q.add_argument("--force", action="store_true", help="replace OUT.bin/OUT.idx if they exist")
    q.set_defaults(func=run_merge)
    q = add_command(dsub, "prepare", "vision SFT JSON Lines -> megatron-energon WebDataset shards")
    q.add_argument("source", help="a JSON Lines file of chats with images (pai_zoo.data.vision_sft's schemas)")
    q.add_argument("--output", required=True, help="the energon dataset folder to write (must not exist unless "
                                                    "--force)")
    q.add_argument("--force", action="store_true", help="replace --output if it exists")
    q.add_argument("--samples-per-shard", type=int, default=1000, help="records per tar shard")
    q.set_defaults(func=run_prepare)


def run_prepare(args) -> int:
    check_inputs((args.source, "the vision SFT data"))  # before megatron-energon is imported
    from ..data.vision_shards import prepare_vision_dataset

    check_output(args.output, force=args.force, kind="folder", flag="--output")  # before energon loads
    counts = prepare_vision_dataset(args.source, args.output, args.samples_per_shard, force=args.force)
    print(f"prepared {args.source} -> {args.output}: {counts['records']} records, {counts['images']} images in "
          f"{counts['shards']} shard(s) (megatron-energon CrudeWebdataset; train --sft --data {args.output})")
    return 0


def run_inspect(args) -> int:
    hub_args(args)  # a Hub id --tokenizer: its tokenizer files in the Hugging Face cache
    from ..data.indexed import IndexedDatasetReader, read_sidecar, statistics

    prefix = resolve_prefix(args.prefix)
    if str(prefix) != args.prefix:
        print(f"{'dataset:':<22} {prefix}")
    stats = statistics(prefix, full=args.full)
    for key, value in stats.items():
        print(f"{key + ':':<22} {value:.2f}" if isinstance(value, float) else f"{key + ':':<22} {value}")
    source = ".bin (read in full)" if args.full or read_sidecar(prefix) is None else "sidecar (--full reads .bin)"
    print(f"{'token ids from:':<22} {source}")
    for line in _sft_lines(prefix, stats):
        print(line)
    if args.document is not None:
        reader = IndexedDatasetReader(prefix)
        if not 0 <= args.document < reader.num_documents:
            raise PaiZooError(f"{prefix}: document {args.document} is out of range "
                              f"(0..{reader.num_documents - 1})")
        ids = reader.document(args.document).tolist()
        print(f"document {args.document}: {len(ids)} tokens")
        if args.tokenizer:
            print(resolve_tokenizer(args.tokenizer).load().decode(ids))
        else:
            print(ids)
    return 0


def _sft_lines(prefix, stats: dict) -> list[str]:
    """What the counts of an SFT dataset (``preprocess --sft``'s sidecar) mean."""
    from ..data.indexed import read_sidecar

    record = (read_sidecar(prefix) or {}).get("sft")
    if not isinstance(record, dict) or not isinstance(record.get("records"), int):
        return []
    records, padding = record["records"], record.get("padding_sequences") or 0
    if record.get("packed"):
        meaning = (f"SFT data: {records} chat records packed into {stats['documents']} documents (one per packed "
                   f"sequence); {stats['sequences']} sequences = {records} records + {padding} padding")
    else:
        meaning = f"SFT data: {records} chat records, one document and one sequence each"
    lines = [f"{'records:':<22} {records}", meaning]
    if record.get("pad_id") is not None:
        lines.append(f"{'pad_id:':<22} {record['pad_id']} (padding has loss mask 0)")
    return lines


def run_merge(args) -> int:
    from ..data.indexed import merge, statistics

    check_dataset_outputs([args.output_prefix], force=args.force, flag="--output-prefix")
    merge([resolve_prefix(p) for p in args.prefixes], args.output_prefix)
    stats = statistics(args.output_prefix)
    print(f"merged {len(args.prefixes)} datasets -> {args.output_prefix}: {stats['documents']} documents, "
          f"{stats['tokens']} tokens")
    return 0
