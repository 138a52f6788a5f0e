"""Text generation (pai_zoo.generation, handle.generate, `pai-zoo generate`).

Reference values come from transformers (``generate``, its logits warpers, ``AutoTokenizer``'s chat
template) or from a second, independent run (full recompute, another seed, another process layout).
"""
import json
import math

import pytest
import torch

import pai_zoo
from pai_zoo import generation
from pai_zoo.cli import main
from pai_zoo.families.registry import get_registry
from pai_zoo.generation import Finisher, GenerationError, SamplingParams, filter_logits, generate
from pai_zoo.mcore import forward
from pai_zoo_conformance import checks
from pai_zoo_conformance.cli_runs import run_cli_on_ranks

LLAMA = get_registry().family("llama")
CONTEXT = 64  # max_position_embeddings of the test checkpoint
PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog and", "A"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """llama3-tiny with unit-scale random weights, the 32000-piece Llama-2-style tokenizer and a 64-token context."""
    path = tmp_path_factory.mktemp("gen") / "llama-tiny"
    case = checks.build_case(LLAMA, vocab_size=32000, max_position_embeddings=CONTEXT)
    case.hf_model.save_pretrained(path)
    LLAMA.published_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def mcore(folder):
    return pai_zoo.load(folder, backend="mcore")


@pytest.fixture(scope="module")
def hf(folder):
    return pai_zoo.load(folder, backend="hf")


# -- equivalence ------------------------------------------------------------------------------
def test_greedy_equals_transformers_generate_for_a_batch_of_different_lengths(mcore, hf):
    ours = generate(mcore, PROMPTS, max_new_tokens=12, eos_token_id=[])
    theirs = generate(hf, PROMPTS, max_new_tokens=12, eos_token_id=[])
    assert len({len(r.prompt_ids) for r in ours}) == 3  # the batch really is padded
    assert [r.token_ids for r in ours] == [r.token_ids for r in theirs]
    assert all(len(r.token_ids) == 12 and r.stop_reason == "length" for r in ours)
    assert [r.text for r in ours] == [mcore.tokenizer.decode(r.token_ids) for r in ours]


def test_conformance_generation_check_passes_and_catches_unmasked_padding(monkeypatch):
    case = checks.build_case(LLAMA)
    report = checks.check_generation(case)
    assert report["rows"] == 4 and report["max_gap"] <= checks.GENERATION_TIE_TOL
    # Break the cache path: new tokens attend to the left padding too.
    monkeypatch.setattr(
        forward, "decode_mask", lambda keep: torch.zeros(keep.shape[0], 1, 1, keep.shape[1], dtype=torch.bool)
    )
    with pytest.raises(checks.ConformanceFailure, match=r"(?s)\[generation\].*step 1 is no near-tie"):
        checks.check_generation(case)


def test_sliding_window_model_matches_transformers_for_a_batch_of_different_lengths():
    # megatron-core's sliding-window attention ignores the padding mask: such batches are split by length.
    report = checks.check_generation(checks.build_case(LLAMA, "mistral-tiny"))
    assert report["tie_rows"] == 0


def test_kv_cache_gives_the_same_tokens_as_full_recompute(mcore):
    for options in (dict(), dict(temperature=0.8, top_k=50, seed=3)):
        cached = generate(mcore, PROMPTS, max_new_tokens=10, eos_token_id=[], **options)
        full = generate(mcore, PROMPTS, max_new_tokens=10, eos_token_id=[], use_cache=False, **options)
        assert [r.token_ids for r in cached] == [r.token_ids for r in full]


def test_model_trains_after_generation(mcore):
    # generation runs under torch.inference_mode; megatron-core caches RoPE frequencies per sequence
    # length and keeps a global buffer that training writes into in place (sequence-parallel
    # all-gather): neither may keep an inference tensor (autograd and in-place writes refuse them).
    from megatron.core import parallel_state

    buffers = parallel_state.get_global_memory_buffer().buffer
    buffers.clear()  # the generation below allocates them afresh
    out = generate(mcore, [[1, 450, 4996], [1, 15043]], max_new_tokens=5, eos_token_id=[])
    for tensor in buffers.values():
        tensor.zero_()  # raises for an inference tensor
    total = 3 + 5
    model = mcore.model
    model.train()
    try:
        ids = torch.tensor([[1, 450, 4996, 29871, 13, 1576, 3681, 338]] * 2)
        mask = torch.triu(torch.ones(total, total, dtype=torch.bool), diagonal=1)[None, None]
        loss = model(ids, torch.arange(total)[None].expand(2, -1), mask).float().logsumexp(-1).mean()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    assert [len(r.token_ids) for r in out] == [5, 5]


def test_right_padded_input_with_attention_mask_equals_unpadded_prompts(mcore):
    prompts = [[1, 450, 4996], [1, 15043]]
    ids = torch.tensor([[1, 450, 4996], [1, 15043, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    padded = generate(mcore, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    single = [generate(mcore, [p], max_new_tokens=6, eos_token_id=[])[0] for p in prompts]
    assert [r.prompt_ids for r in padded] == prompts
    assert [r.token_ids for r in padded] == [r.token_ids for r in single]


# -- sampling ---------------------------------------------------------------------------------
def test_sampling_is_reproducible_with_a_seed_and_differs_across_seeds(mcore, hf):
    for handle in (mcore, hf):
        runs = [
            generate(handle, PROMPTS[:2], max_new_tokens=12, temperature=1.0, seed=s, eos_token_id=[])
            for s in (7, 7, 8)
        ]
        ids = [[r.token_ids for r in run] for run in runs]
        assert ids[0] == ids[1]
        assert ids[0] != ids[2]
    greedy = generate(mcore, PROMPTS[:2], max_new_tokens=12, eos_token_id=[])
    top1 = generate(mcore, PROMPTS[:2], max_new_tokens=12, temperature=1.0, top_k=1, seed=9, eos_token_id=[])
    assert [r.token_ids for r in top1] == [r.token_ids for r in greedy]


def test_top_k_and_top_p_by_hand():
    logits = torch.tensor([[math.log(p) for p in (0.1, 0.2, 0.3, 0.4)]])
    def kept(out):
        return torch.isfinite(out[0]).nonzero().flatten().tolist()
    assert kept(filter_logits(logits, top_k=2)) == [2, 3]
    assert kept(filter_logits(logits, top_p=0.35)) == [3]           # 0.4 alone reaches 0.35
    assert kept(filter_logits(logits, top_p=0.65)) == [2, 3]        # 0.4 < 0.65 <= 0.4 + 0.3
    assert kept(filter_logits(logits, top_p=0.75)) == [1, 2, 3]
    assert kept(filter_logits(logits, top_k=3, top_p=0.45)) == [2, 3]
    halved = filter_logits(logits, temperature=0.5)
    assert torch.allclose(halved.softmax(-1), torch.tensor([[0.01, 0.04, 0.09, 0.16]]) / 0.30)


def test_top_k_and_top_p_match_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=gen) * 3
    for temperature, k, p in ((1.0, 10, 1.0), (1.0, 0, 0.9), (0.7, 40, 0.5), (1.3, 3, 0.99), (1.0, 0, 0.01)):
        expected = logits.clone()
        expected = TemperatureLogitsWarper(temperature)(None, expected)
        if k:
            expected = TopKLogitsWarper(k)(None, expected)
        if p < 1:
            expected = TopPLogitsWarper(p)(None, expected)
        got = filter_logits(logits, temperature, k, p)
        assert torch.equal(torch.isfinite(got), torch.isfinite(expected)), (temperature, k, p)
        assert torch.allclose(got[torch.isfinite(got)], expected[torch.isfinite(expected)])


# -- stopping ---------------------------------------------------------------------------------
def test_stop_strings_cut_the_text_and_stop_early(mcore, hf):
    full = generate(mcore, PROMPTS[1], max_new_tokens=12, eos_token_id=[])[0]
    prefix = mcore.tokenizer.decode(full.token_ids[:4])
    stop = mcore.tokenizer.decode(full.token_ids[:6])[len(prefix) + 1:][:3]  # text inside tokens 5-6
    assert stop and stop not in prefix
    for handle in (mcore, hf):
        [cut] = generate(handle, PROMPTS[1], max_new_tokens=12, eos_token_id=[], stop=["never there", stop])
        assert cut.stop_reason == "stop"
        assert cut.text == full.text[: full.text.index(stop)]
        assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
        decoded = handle.tokenizer.decode(cut.token_ids)
        assert stop in decoded and stop not in handle.tokenizer.decode(cut.token_ids[:-1])


def test_eos_ends_the_completion(mcore, hf):
    full = generate(mcore, PROMPTS[0], max_new_tokens=10, eos_token_id=[])[0]
    eos = full.token_ids[5]
    first = full.token_ids.index(eos)
    for handle in (mcore, hf):
        [out] = generate(handle, PROMPTS[0], max_new_tokens=10, eos_token_id=eos)
        assert out.stop_reason == "eos"
        assert out.token_ids == full.token_ids[: first + 1]
        assert out.text == mcore.tokenizer.decode(full.token_ids[:first])
    # The model's own EOS (id 2 in the config and tokenizer) is the default.
    assert generation.eos_ids(mcore) == (2,)


def test_streamed_text_arrives_in_pieces_and_adds_up_to_the_completion(mcore):
    pieces = []
    [out] = generate(mcore, PROMPTS[0], max_new_tokens=12, eos_token_id=[], on_text=lambda i, d: pieces.append(d))
    assert len(pieces) > 3 and "".join(pieces) == out.text
    stop = out.text[len(out.text) // 2:][:2]
    pieces = []
    [cut] = generate(
        mcore, PROMPTS[0], max_new_tokens=12, eos_token_id=[], stop=stop, on_text=lambda i, d: pieces.append(d)
    )
    assert "".join(pieces) == cut.text and stop not in "".join(pieces)


def test_finisher_holds_back_a_possible_stop_string():
    words = {1: "ab", 2: "cX", 3: "Y", 4: "z"}
    def decode(ids):
        return "".join(words[i] for i in ids)
    seen = []
    finisher = Finisher(SamplingParams(max_new_tokens=10, stop=("XY",)), (), decode, seen.append)
    assert [finisher.add(t) for t in (1, 2, 3)] == [False, False, True]
    assert finisher.reason == "stop" and finisher.text() == "abc" and finisher.tokens == [1, 2, 3]
    assert seen == ["a", "bc"]  # the last len("XY") - 1 characters wait until they cannot start "XY"


# -- CLI --------------------------------------------------------------------------------------
def _write(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_cli_jsonl_in_and_out(folder, mcore, tmp_path):
    prompts = _write(
        tmp_path / "in.jsonl", [{"prompt": PROMPTS[0], "id": "a"}, "", {"prompt": PROMPTS[1]}, {"prompt": [1, 15043]}]
    )
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(folder), "--prompts", str(prompts), "--output", str(out),
                 "--max-new-tokens", "7", "--batch-size", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = generate(mcore, [PROMPTS[0], PROMPTS[1], [1, 15043]], max_new_tokens=7)
    assert [r["token_ids"] for r in rows] == [e.token_ids for e in expected]
    assert [r["completion"] for r in rows] == [e.text for e in expected]
    assert [r["stop_reason"] for r in rows] == [e.stop_reason for e in expected]
    assert rows[0]["id"] == "a" and rows[1]["prompt"] == PROMPTS[1] and rows[2]["prompt"] == [1, 15043]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_cli_prompt_is_streamed_to_stdout(folder, mcore, capsys):
    assert main(["generate", "--model", str(folder), "--prompt", PROMPTS[0], "--max-new-tokens", "9"]) == 0
    captured = capsys.readouterr()
    expected = generate(mcore, PROMPTS[0], max_new_tokens=9)[0]
    assert captured.out == expected.text + "\n"
    assert f"[{expected.stop_reason}: {len(expected.token_ids)} tokens]" in captured.err


def test_cli_chat_uses_the_chat_template_like_transformers(folder, mcore, tmp_path):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompts = _write(tmp_path / "chat.jsonl", [{"messages": messages}])
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(folder), "--prompts", str(prompts), "--output", str(out), "--chat",
                 "--max-new-tokens", "4"]) == 0
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    reference = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    reference = list(reference["input_ids"] if hasattr(reference, "keys") else reference)
    [expected] = generate(mcore, [reference], max_new_tokens=4)
    assert row["prompt_tokens"] == len(reference) and row["token_ids"] == expected.token_ids
    assert row["messages"] == messages


def test_cli_chat_takes_a_file_that_mixes_prompt_and_messages_records(folder, mcore, tmp_path):
    from transformers import AutoTokenizer

    chat = [{"role": "user", "content": "Name a colour."}]
    prompts = _write(tmp_path / "mixed.jsonl", [{"prompt": "Name a colour."}, {"messages": chat}, {"prompt": [5, 6]}])
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(folder), "--prompts", str(prompts), "--output", str(out), "--chat",
                 "--max-new-tokens", "4"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    reference = AutoTokenizer.from_pretrained(folder).apply_chat_template(chat, add_generation_prompt=True,
                                                                          tokenize=True)
    reference = list(reference["input_ids"] if hasattr(reference, "keys") else reference)
    # a text prompt is one user turn under --chat; ids are taken as they are
    assert [r["prompt_tokens"] for r in rows] == [len(reference), len(reference), 2]
    assert rows[0]["token_ids"] == rows[1]["token_ids"] == generate(mcore, [reference], max_new_tokens=4)[0].token_ids
    assert rows[0]["prompt"] == "Name a colour." and rows[1]["messages"] == chat


def test_read_prompts_with_chat_reads_both_record_kinds_and_refuses_a_record_with_both(tmp_path):
    from pai_zoo.generation import encode_prompt, read_prompts

    chat = [{"role": "user", "content": "hi"}]
    path = _write(tmp_path / "mixed.jsonl", [{"prompt": "hi"}, {"messages": chat}])
    assert [p for _, _, p in read_prompts(path, chat=True)] == ["hi", chat]
    tokenizer = pai_zoo.load("llama3-tiny").tokenizer
    assert encode_prompt("hi", tokenizer, chat=True) == encode_prompt(chat, tokenizer, chat=True)
    with pytest.raises(GenerationError, match=r"mixed.jsonl:2: no 'prompt' key; use 'messages' \(with --chat\)"):
        read_prompts(path)
    both = _write(tmp_path / "both.jsonl", [{"prompt": "hi", "messages": chat}])
    with pytest.raises(GenerationError, match=r"both.jsonl:1: the record has both 'prompt' and 'messages'; give one"):
        read_prompts(both, chat=True)


# -- bad input --------------------------------------------------------------------------------
def _fails(folder, tmp_path, lines, *extra, capsys):
    prompts = _write(tmp_path / "bad.jsonl", lines)
    out = tmp_path / "out.jsonl"
    code = main(["generate", "--model", str(folder), "--prompts", str(prompts), "--output", str(out),
                 *(extra or ("--max-new-tokens", "8"))])
    assert code != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # no output, no temporary file left
    return capsys.readouterr().err


def test_empty_prompt_names_the_line(folder, tmp_path, capsys):
    err = _fails(folder, tmp_path, [{"prompt": "ok"}, {"prompt": ""}], capsys=capsys)
    assert "bad.jsonl:2: the prompt is empty" in err
    with pytest.raises(GenerationError, match=r"prompt 1: the prompt is empty \(no tokens\)"):
        generate(pai_zoo.load("llama3-tiny"), [[1, 2], []])


def test_malformed_json_names_file_and_line(folder, tmp_path, capsys):
    err = _fails(folder, tmp_path, [{"prompt": "ok"}, "", '{"prompt": "unterminated'], capsys=capsys)
    assert "bad.jsonl:3: malformed JSON" in err


def test_missing_key_and_chat_mismatch_are_explained(folder, tmp_path, capsys):
    err = _fails(folder, tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}], capsys=capsys)
    assert "bad.jsonl:1: no 'prompt' key; use 'messages' (with --chat)" in err


def test_too_long_prompt_names_the_context_and_truncate_left_fits_it(folder, mcore, tmp_path, capsys):
    long_ids = list(range(100, 160))  # 60 tokens + 8 new > 64
    err = _fails(folder, tmp_path, [{"prompt": "short"}, {"prompt": long_ids}], "--max-new-tokens", "8", capsys=capsys)
    assert "bad.jsonl:2: 60 prompt tokens + max_new_tokens=8 exceed the model's context of 64 tokens" in err
    [out] = generate(mcore, [long_ids], max_new_tokens=8, truncate="left", eos_token_id=[])
    assert out.prompt_ids == long_ids[4:] and out.truncated == 4 and len(out.token_ids) == 8
    [direct] = generate(mcore, [long_ids[4:]], max_new_tokens=8, eos_token_id=[])
    assert direct.token_ids == out.token_ids


def test_unknown_checkpoint_is_a_clear_error(tmp_path, capsys):
    prompts = _write(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    code = main(
        [
            "generate",
            "--model",
            str(tmp_path / "nowhere"),
            "--prompts",
            str(prompts),
            "--output",
            str(tmp_path / "o.jsonl"),
        ]
    )
    assert code == 1
    assert "nowhere" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_text_prompt_without_tokenizer_is_refused():
    handle = pai_zoo.load("llama")  # the family's name builds its tiny preset, without a tokenizer
    with pytest.raises(GenerationError, match="needs a tokenizer"):
        generate(handle, "hello")
    [one] = generate(handle, [1, 2, 3], max_new_tokens=3, eos_token_id=[])  # one prompt of ids
    assert one.prompt_ids == [1, 2, 3] and len(one.token_ids) == 3 and one.text is None


# -- tensor parallel --------------------------------------------------------------------------
def test_tensor_parallel_2_generates_the_same_tokens_as_one_process(folder, tmp_path):
    from pai_zoo.conversion.entry import convert

    ckpt = tmp_path / "mcore"
    convert(folder, ckpt, "mcore", tp=2, progress=False)
    prompts = _write(tmp_path / "in.jsonl", [{"prompt": p} for p in PROMPTS])
    out = tmp_path / "out.jsonl"
    proc = run_cli_on_ranks(["generate", "--model", str(ckpt), "--tp", "2", "--prompts", str(prompts), "--output",
                             str(out), "--max-new-tokens", "10", "--threads", "1"], timeout=300)  # as under torchrun
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    single = generate(pai_zoo.load(ckpt), PROMPTS, max_new_tokens=10)
    assert [r["token_ids"] for r in rows] == [s.token_ids for s in single]
    assert len(rows) == 3 and all(len(r["token_ids"]) >= 1 for r in rows)
