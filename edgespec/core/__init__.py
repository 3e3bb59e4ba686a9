"""The core: one round loop and the exact math it stands on.

- the math: :mod:`.sampling` (``SamplingParams``, ``logits_to_probs``, the one place
  logits become probabilities), :mod:`.coupling` (seed-invariant sampling: the race),
  :mod:`.acceptance` (the acceptance rule), :mod:`.shaping` and :mod:`.grammar` (what
  a request does to each row: bias, penalties, a grammar's mask);
- the contracts the engine is written against: :mod:`.backend` (``Backend``: one
  model), :mod:`.draft` (``Draft``, ``Drafter``), :mod:`.planner` (``Planner``,
  ``Planners``, ``FixedPlanner``, one round's drafting);
- the state: :mod:`.cache` (a KV cache as the token ids it holds), :mod:`.prompt_cache`
  and :mod:`.prompt_disk` (saved prompts in RAM and in a folder), :mod:`.stats`;
- :mod:`.config`: ``PlannerConfig``, the tunables of auto mode (the planner, its cost
  model and the copying drafters), read by the drafters and the planner above;
- text: :mod:`.chat_template`, :mod:`.prompting`, :mod:`.detokenize`;
- the loop: :mod:`.engine` and :mod:`.generation` (a generation's chunks and result).

May import: errors, paths.
"""
