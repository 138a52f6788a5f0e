"""``make demo``: the main job on a built-in tiny default.

Builds ``llama3-tiny`` as a transformers model with random weights, saves it as a Hugging
Face checkpoint, loads that checkpoint as a megatron-core ``GPTModel`` through the Llama
family's weight table, moves the weights back to a fresh transformers model, and shows that
the logits agree and the weights come back bit-identical.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

LOGITS_ATOL = 1e-4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pai_zoo.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-tiny")
    args = parser.parse_args(argv)

    import torch

    import pai_zoo
    from pai_zoo import hf

    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    source = pai_zoo.load(args.preset, backend="hf", seed=0)
    print(f"[1/4] {args.preset}: transformers {type(source.model).__name__}, "
          f"{sum(p.numel() for p in source.model.parameters()):,} parameters (random weights)")
    with tempfile.TemporaryDirectory() as folder:
        source.model.save_pretrained(folder)
        mcore = pai_zoo.load(folder, backend="mcore")
    print(f"[2/4] HF -> mcore: megatron-core {type(mcore.model).__name__} from the saved checkpoint "
          f"(family {mcore.family.name}, padded vocabulary {mcore.mcore_config.padded_vocab_size()})")

    back = hf.build_hf_model(source.family, source.hf_config)
    back.load_state_dict(mcore.hf_state_dict())
    same = all(torch.equal(a, b) for a, b in zip(source.model.state_dict().values(), back.state_dict().values()))
    print(f"[3/4] mcore -> HF: {'bit-identical' if same else 'DIFFERENT'} weights")

    ids = torch.randint(0, mcore.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    reference = source.logits(ids)
    deltas = {"mcore": (mcore.logits(ids) - reference).abs().max().item(),
              "HF round trip": (torch.as_tensor(back(input_ids=ids).logits.detach()) - reference).abs().max().item()}
    argmax = bool((mcore.logits(ids).argmax(-1) == reference.argmax(-1)).all())
    for name, delta in deltas.items():
        print(f"[4/4] logits {name} vs original: max |delta| = {delta:.2e}")
    ok = same and argmax and all(d <= LOGITS_ATOL for d in deltas.values())
    print(f"{'OK' if ok else 'FAILED'}: logits agree within {LOGITS_ATOL:g}, same argmax: {argmax} "
          f"({time.perf_counter() - start:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
