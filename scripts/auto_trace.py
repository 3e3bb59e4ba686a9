"""Trace auto mode round by round on one real generation: what it chose, and why.

``policy_sim.py`` replays the planner on recorded traces with the calibration's
costs; this runs the real engine and prints, after each round, what the planner
believed when it made its next decision: each drafter's expected speed in step
with the text and with the catch-up it owes, its acceptance estimates, the
exploration budget and the draft model's stop. A diagnosis tool: where the real
engine and the sim part ways (session 14: a draft model locked out by its own
growing catch-up on the code set), this shows it. Not a benchmark.

    python scripts/auto_trace.py --prompts code --index 0 --temp 0
"""

from __future__ import annotations

import argparse

from edgespec.calibration import prior_for
from edgespec.costs import CostModel
from edgespec.drafters import PromptLookup
from edgespec.drafters.draft_model import DraftModel
from edgespec.engine import Engine
from edgespec.loading import BackendOptions, load_backend
from edgespec.planner import RoundResult
from edgespec.policy import AdaptivePlanner, PolicyConfig, auto_drafters
from edgespec.prompt_sets import load_prompt_set
from edgespec.prompting import chat_prompt_ids
from edgespec.sampling import SamplingParams


class TracedPlanner(AdaptivePlanner):
    """The real planner, printing its beliefs after each round."""

    position = 0

    def observe(self, result: RoundResult) -> None:
        super().observe(result)
        beliefs = []
        for drafter in self.drafters:
            name = drafter.name
            if drafter.kind != "model":
                continue
            behind = self._state[name].behind
            in_step = self.best_k(name, name, self.max_draft)
            owed = self.best_k(name, name, self.max_draft, behind=behind)
            alpha = " ".join(f"{a:.2f}" for a in self.tracker(name).alpha[:4])
            offer = " ".join(f"{o:.2f}" for o in self.tracker(name)._offers(4, 0.0))
            beliefs.append(f"{name[:12]}: k={in_step[0]} {in_step[1]:.3f}x in step, "
                           f"{owed[1]:.3f}x behind {behind}; alpha {alpha}; offer {offer}")
        print(f"t={self.position:4d} {(result.drafter or 'plain')[:12]:12s} "
              f"drafted {result.num_drafted} accepted {result.num_accepted}  "
              f"budget {self.exploration:5.2f} stop {self.stop_at:.2f}  " + " | ".join(beliefs))
        self.position += result.num_committed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", default="code", help="a built-in prompt set")
    parser.add_argument("--index", type=int, default=0, help="which prompt of the set")
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    options = BackendOptions()
    target = load_backend(args.target, options)
    draft = load_backend(args.draft, options)
    model = DraftModel(draft)
    # The cached costs of this pair, as `edgespec generate` starts from them.
    prior = prior_for(target, [(model.name, draft)])
    planner = TracedPlanner(auto_drafters(model, PromptLookup(max_ngram=8)), CostModel(prior),
                            PolicyConfig())
    engine = Engine(target, None, num_draft=2)
    engine.configure(model, "auto", planner)
    prompt = load_prompt_set(args.prompts)[args.index]
    ids = chat_prompt_ids(target, [{"role": "user", "content": prompt}])
    generation = engine.generate(ids, SamplingParams(temperature=args.temp, seed=0),
                                 max_tokens=args.max_tokens)
    stats = generation.stats
    print(f"{stats.generated_tokens} tokens, {stats.tokens_per_second:.2f} tok/s, "
          f"{stats.rounds} rounds, {stats.plain_steps} plain steps")
    engine.close()


if __name__ == "__main__":
    main()
