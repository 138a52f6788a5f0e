"""A third-party RL trainer registered through the ``pai_zoo_rl_trainers`` hook (a test fixture).

``best-of-n`` samples ``n`` responses per prompt from a policy, scores them with a reward (a
reward model or a ``rule:...``) and writes the best one per prompt to ``SAVE/best.jsonl`` - the
data step of rejection-sampling fine-tuning, built only from pai-zoo's public RL pieces. The
module imports neither torch nor megatron-core (``pai-zoo list`` imports every plugin).
"""
from __future__ import annotations

import json
from pathlib import Path

from pai_zoo import hookimpl
from pai_zoo.rl import RLTrainer


class BestOfN(RLTrainer):
    name = "best-of-n"
    description = "best-of-n sampling: the highest-reward response per prompt (third-party test plugin)"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--model", required=True)
        parser.add_argument("--reward", required=True)
        parser.add_argument("--prompts", required=True)
        parser.add_argument("--save", required=True)
        parser.add_argument("--n", type=int, default=4)
        parser.add_argument("--max-new-tokens", type=int, default=4)
        parser.add_argument("--seed", type=int, default=0)

    def run(self) -> dict:
        from pai_zoo.generation import generate
        from pai_zoo.rl.data import read_prompts
        from pai_zoo.rl.models import load_model
        from pai_zoo.rl.rewards import make_reward

        s = self.settings
        policy = load_model(s["model"], seed=s["seed"])
        reward, _ = make_reward(s["reward"])
        prompts = read_prompts(s["prompts"], policy.tokenizer, policy.vocab_size)
        repeated = [p for p in prompts for _ in range(s["n"])]
        responses = [g.token_ids for g in generate(policy, repeated, max_new_tokens=s["max_new_tokens"],
                                                   temperature=1.0, seed=s["seed"])]
        scores = reward(repeated, responses).tolist()
        out, best_scores = [], []
        for i, prompt in enumerate(prompts):
            group = range(i * s["n"], (i + 1) * s["n"])
            best = max(group, key=lambda j: scores[j])
            best_scores.append(scores[best])
            out.append({"prompt": prompt, "response": responses[best], "score": scores[best],
                        "scores": [scores[j] for j in group]})
        save = Path(s["save"])
        save.mkdir(parents=True, exist_ok=True)
        (save / "best.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
        return {"prompts": len(prompts), "mean_best": sum(best_scores) / len(best_scores),
                "mean_all": sum(scores) / len(scores), "output": str(save / "best.jsonl")}


@hookimpl
def pai_zoo_rl_trainers():
    return {"best-of-n": BestOfN}
