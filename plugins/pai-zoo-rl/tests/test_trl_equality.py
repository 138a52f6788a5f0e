"""pai-zoo's DPO and GRPO losses equal TRL's own trainers' (``trl.DPOTrainer.compute_loss``,
``trl.GRPOTrainer._compute_loss``) on the same weights, batch and reference log-probabilities, within 1e-5 (fp32),
and so do their gradients -- on every parameter, TRL's taken on the transformers model and pai-zoo's on the
megatron-core model, brought to Hugging Face names by the family's own weight table. The model is llama-odd
(6 query heads over 2 key-value heads: GQA ratio 3; head_dim 16, not hidden 72 / 6) at a vocabulary of 300 (not a
multiple of 128: the megatron-core model's padded rows must never count). The DPO pairs' prompts and answers differ
in length, and so do the GRPO completions (right padding); left-padded GRPO prompts are checked against
transformers given the positions (see the GRPO test)."""
from __future__ import annotations

import random

import pytest
import torch

import pai_zoo
from pai_zoo.data import toy
from pai_zoo.weights import mcore_tensors, mcore_to_hf

pytestmark = pytest.mark.megatron_once  # the losses are plain torch on the logits: one megatron-core version
TOL = 1e-5
VOCAB = 300


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The HF folder of llama-odd (vocab 300, a BPE tokenizer), its transformers model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("trl") / "llama-odd"
    pai_zoo.load("llama-odd", backend="hf", seed=3, vocab_size=VOCAB).model.save_pretrained(folder)
    toy.write_tokenizer(folder, vocab_size=VOCAB)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return folder, tokenizer, lambda: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def _mcore(folder):
    handle = pai_zoo.load(folder, backend="mcore", dtype=torch.float32)
    handle.model.train()
    return handle


def _logits(handle, ids, mask):
    from pai_zoo.mcore.pipeline import forward_logits

    return forward_logits(handle.model, ids, mask)


def _close_grads(handle, hf_model, where: str) -> float:
    """Max |grad_pai-zoo - grad_TRL| over every parameter, in HF names; fails past TOL (relative above 1)."""
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p))
             for name, p in handle.model.named_parameters()}
    named = mcore_tensors(handle.model)
    as_mcore = {k: grads[k] if k in grads else torch.zeros_like(v) for k, v in named.items()}
    hf_grads = mcore_to_hf(handle.family, handle.mcore_config, as_mcore)
    reference = {n: p.grad for n, p in hf_model.named_parameters()}
    worst = 0.0
    for name, ref in reference.items():
        assert ref is not None, f"{where}: TRL left {name} without a gradient"
        got = hf_grads[name if name in hf_grads else "lm_head.weight"]
        scale = max(float(ref.abs().max()), 1e-3)
        delta = float((got.float() - ref.float()).abs().max())
        assert delta <= TOL * max(1.0, scale), f"{where}: {name} gradient differs by {delta} (scale {scale})"
        worst = max(worst, delta)
    return worst


def _pairs(tokenizer, n: int = 5):
    rng = random.Random(1)
    words = "the a cat dog sat ran on under mat red blue big".split()

    def text(k):
        return " ".join(rng.choice(words) for _ in range(k))

    return [{"prompt": text(rng.randint(2, 6)), "chosen": " " + text(rng.randint(1, 5)),
             "rejected": " " + text(rng.randint(1, 7))} for _ in range(n)]


@pytest.mark.parametrize("loss_type,label_smoothing", [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0),
                                                       ("robust", 0.2), ("sigmoid_norm", 0.0)])
def test_dpo_loss_and_gradients_equal_trl(models, loss_type, label_smoothing, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from pai_zoo.rl.data import Pair
    from pai_zoo.rl.policy import token_logprobs
    from pai_zoo_rl.dpo import batch_loss, pair_batch

    folder, tokenizer, hf_model = models
    beta = 0.3
    policy = hf_model()
    with torch.no_grad():  # a policy that is not the reference: the log-ratios are not all 0
        for p in policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    trainer = DPOTrainer(model=policy, ref_model=hf_model(), processing_class=tokenizer,
                         train_dataset=Dataset.from_list(_pairs(tokenizer)),
                         args=DPOConfig(output_dir=str(tmp_path / "trl"), beta=beta, loss_type=[loss_type],
                                        label_smoothing=label_smoothing, report_to=[], use_cpu=True, bf16=False,
                                        precompute_ref_log_probs=False, max_length=None))
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    inputs = trainer.data_collator(rows)
    # pai-zoo: the same pairs (the ids TRL tokenized), the policy's weights in megatron-core; the reference
    # log-probabilities pai-zoo precomputes are TRL's too (its precomputed-reference path)
    policy_folder = tmp_path / "policy"
    policy.save_pretrained(policy_folder)
    handle, ref_handle = _mcore(policy_folder), _mcore(folder)
    pairs = [Pair(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in rows]
    batch = pair_batch(pairs, tokenizer.pad_token_id)
    assert torch.equal(batch["ids"], inputs["input_ids"]) and torch.equal(batch["completion"],
                                                                           inputs["completion_mask"])
    batch["ref"] = (token_logprobs(ref_handle.model, batch, VOCAB) * batch["completion"][:, 1:]).sum(-1)
    inputs["ref_chosen_logps"], inputs["ref_rejected_logps"] = batch["ref"].chunk(2)
    trainer.precompute_ref_logps = True
    policy.train()
    trl_loss = trainer.compute_loss(policy, inputs)
    trl_loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    loss, values = batch_loss(_logits(handle, batch["ids"], batch["mask"]), batch, handle.vocab_size, beta,
                              loss_type, label_smoothing)
    loss.backward()
    assert abs(float(loss) - float(trl_loss)) <= TOL * max(1.0, abs(float(trl_loss))), (float(loss), float(trl_loss))
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"):
        assert abs(float(values[key]) - metrics[key]) <= 1e-4 * max(1.0, abs(metrics[key])), (key, values, metrics)
    _close_grads(handle, policy, f"dpo {loss_type}")


def _grpo_trainer(policy, reference, tokenizer, tmp_path, **config):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def constant(prompts, completions, **fields):
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path / "trl-grpo"), report_to=[], use_cpu=True, bf16=False,
                      per_device_train_batch_size=6, num_generations=3, max_completion_length=5, **config)
    trainer = GRPOTrainer(model=policy, reward_funcs=constant, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": "a"}] * 6))
    if reference is not None:
        trainer.ref_model = reference
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.mark.parametrize("loss_type,beta,epsilon_high,temperature,correction", [
    ("grpo", 0.04, None, 1.0, True), ("bnpo", 0.0, None, 1.0, True), ("dr_grpo", 0.1, 0.28, 0.7, False),
    ("dapo", 0.04, 0.28, 1.0, True)])
def test_grpo_loss_and_gradients_equal_trl(models, loss_type, beta, epsilon_high, temperature, correction, tmp_path):
    """Two optimisation iterations' worth: the sampling policy's log-probabilities differ from the policy's (the
    ratio is not 1, and some tokens clip), the advantages are TRL's group-normalised ones from rewards.

    The prompts of the TRL batch are of one length: TRL's loss forward passes no position ids, so on a left-padded
    prompt transformers counts the padding into the positions, which the sampling did not (its generate counts real
    tokens only, as pai-zoo does throughout); left-padded prompts are checked against transformers given the
    positions instead."""
    from pai_zoo_rl.grpo import batch_loss
    from pai_zoo_rl.grpo_loss import group_advantages

    folder, tokenizer, hf_model = models
    policy, reference, old = hf_model(), hf_model(), hf_model()
    with torch.no_grad():
        for model, scale in ((policy, 0.05), (old, 0.02)):
            for p in model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 7)))
    trainer = _grpo_trainer(policy, reference, tokenizer, tmp_path, loss_type=loss_type, beta=beta,
                            epsilon_high=epsilon_high, temperature=temperature, use_bias_correction_kl=correction)
    rng = random.Random(4)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(4)] for _ in range(2) for _ in range(3)]
    completions = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 5))] for _ in range(6)]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 2.0])
    advantages, _ = group_advantages(rewards, 3, "group")
    P, T = max(map(len, prompts)), max(map(len, completions))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad] * (T - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (T - len(c)) for c in completions])
    ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    for folder_name, model in (("old", old), ("reference", reference)):
        model.save_pretrained(tmp_path / folder_name)
    tokens = float(completion_mask.sum())
    batch = {"ids": ids, "mask": mask, "completion": completion_mask, "P": P, "advantages": advantages,
             "batch_tokens": tokens}
    from pai_zoo.rl.policy import token_logprobs

    for key, name in (("old", "old"), ("ref", "reference")):
        other = _mcore(tmp_path / name)
        batch[key] = token_logprobs(other.model, batch, VOCAB, temperature)[:, P - 1:]
    if beta == 0.0:
        batch.pop("ref")
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": batch["old"],
              "num_items_in_batch": torch.tensor(tokens)}
    if beta != 0.0:
        inputs["ref_per_token_logps"] = batch["ref"]
    policy.train()
    trl_loss = trainer._compute_loss(policy, inputs)
    trl_loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    padded = torch.tensor([[pad] * k + [rng.randrange(3, VOCAB) for _ in range(9 - k)] for k in (0, 3, 5)])
    padded_mask = (torch.arange(9) >= torch.tensor([0, 3, 5])[:, None]).long()

    policy.save_pretrained(tmp_path / "policy")
    handle = _mcore(tmp_path / "policy")
    loss, values = batch_loss(_logits(handle, ids, mask), batch, handle.vocab_size, temperature=temperature, beta=beta,
                              epsilon=0.2, epsilon_high=epsilon_high, loss_type=loss_type, max_completion_length=5,
                              bias_correction_kl=correction)
    loss.backward()
    with torch.no_grad():  # left-padded prompts: pai-zoo's positions are transformers' with explicit position ids
        from pai_zoo.rl.policy import next_token_logprobs

        pos = (padded_mask.cumsum(-1) - 1).clamp(min=0)
        mine = next_token_logprobs(_logits(handle, padded, padded_mask), padded, VOCAB, temperature)
        hf = next_token_logprobs(policy(input_ids=padded, attention_mask=padded_mask, position_ids=pos).logits,
                                 padded, VOCAB, temperature)
        assert float(((mine - hf) * padded_mask[:, 1:] * padded_mask[:, :-1]).abs().max()) <= TOL
    assert abs(float(loss) - float(trl_loss)) <= TOL * max(1.0, abs(float(trl_loss))), (float(loss), float(trl_loss))
    assert float(values["clip_ratio/region_mean"]) == pytest.approx(metrics["clip_ratio/region_mean"], abs=1e-6)
    if beta:
        assert float(values["kl"]) == pytest.approx(metrics["kl"], rel=1e-4, abs=1e-6)
    assert float(values["entropy"]) == pytest.approx(metrics["entropy"], rel=1e-4)
    _close_grads(handle, policy, f"grpo {loss_type}")
