"""The tunables of auto mode (the planner, its cost model, and the copying drafters it
asks), in one frozen object a test can build. It sits in the core, below the drafters
and the planner, since both read it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlannerConfig:
    """The tunables of auto mode (tuned on the built-in tuning prompt sets with
    ``scripts/planner_sim.py``, then measured with ``edgespec bench``; docs/auto-mode.md)."""

    max_draft: int = 64           # the longest draft auto mode proposes
    draft_p_min: float = 0.7      # a draft model stops below this top probability ...
    learn_stop: bool = True       # ... at first: auto mode learns where drafting stops paying
    stop_prior_weight: float = 6.0  # pseudo-observations behind a confidence bin's α (its midpoint)
    lowest_stop: float = 0.05     # a draft model always stops below this
    decay: float = 0.95           # weight of the past in the acceptance estimates
    prior_weight: float = 3.0     # pseudo-observations behind a prior acceptance rate
    aging: float = 0.99           # evidence kept per round in which a drafter was not tried
    optimism: float = 0.35        # standard errors added to α when deciding (explores the unsure)
    min_gain: float = 1.04        # speculate when expected to beat plain by this much
    probe_gain: float = 1.04      # ... or, as a probe, when it might (with optimism)
    model_prior: float = 0.95     # α of a draft model before evidence
    model_prior_weight: float = 3.0  # ... and the pseudo-observations behind it
    offer_weight: float = 6.0     # pseudo-observations behind a draft model's offer rate
    confidence_prior: float = 0.4  # the target's confidence before any token
    confidence_weight: float = 2.0
    confidence_decay: float = 0.95  # the target's confidence changes with the text: follow it
    # α before evidence, by the kind of drafter (edgespec.core.draft: "copy" or
    # "model") and the kind of its draft (Draft.bucket). A copy (prompt lookup, the
    # suffix drafter where the context holds the longest match) is classed by how far
    # back its match reaches: 2 tokens is often a coincidence, 16 or more a copy in
    # progress; a copy picked up again just past where it broke off (an edit), however
    # short its match, is likely one too. The suffix drafter's other drafts are classed
    # by their empirical probability and first match (edgespec.drafters.suffix.confidence_bucket).
    # A Predicted Output's drafts while the reply is in step with it ("follow") held 0.93-0.95
    # of the time on scripts/bench_predictions.py's edits; 0.85 leaves room for other edits.
    # A kind with no prior of its own here starts from the drafter kind's (copy_prior,
    # model_prior).
    priors: dict[str, float] = field(default_factory=lambda: {
        "copy:match2": 0.3, "copy:match3": 0.4, "copy:match4": 0.6, "copy:match8": 0.8,
        "copy:match16": 0.85, "copy:match32": 0.9, "copy:resume": 0.7, "copy:follow": 0.85,
        "copy:maybe": 0.3, "copy:maybe-long": 0.4, "copy:likely": 0.4, "copy:likely-long": 0.5,
        "copy:sure": 0.6, "copy:sure-long": 0.8})
    copy_prior: float = 0.5       # α of a copying drafter's drafts with no prior of their own above
    # Believe a copying drafter's own chance, per token, that its copy holds (Draft.hold:
    # learned from where copies broke in this text) for a draft's later positions, rather
    # than one rate learned from verified drafts alone.
    copy_holds: bool = True
    # A draft that continues a copy is accepted whole or cut at one point: the α of the
    # later positions, given the ones before were accepted (one rate, shared), starts
    # from the first position's α lifted by this share of its distance to 1.
    continuation_lift: float = 0.3
    compare_drafters: bool = True  # a cheap drafter's draft gives way to a better later one
    catch_up_rounds: float = 3.0  # rounds a draft model's catch-up is spread over (it pays
    #                               once for a run of rounds, but not to get back in for one)
    cheap_drafter: float = 0.05   # a drafter cheaper than this (c) is asked for all it has
    retry_after: int = 32         # rounds before a drafter whose costs are unmeasured is retried
    retry_max: int = 512          # the longest back-off between losing retries
    retry_budget: float = 1.0     # plain steps a retry's catch-up may cost
    stale_after: int = 256        # rounds after which a measured cost counts as unmeasured
    refresh_plain_after: int = 128  # rounds between plain steps that re-measure the plain step
    # Exploration is paid from a budget, in plain steps: it starts at explore_start, earns
    # explore_rate per committed token, is charged what each probe round lost at typical costs
    # (credited what one won) and holds at most explore_cap. Where nothing pays, probes cost
    # ~explore_rate.
    explore_start: float = 2.0
    explore_rate: float = 0.01
    explore_cap: float = 4.0
    # -- the cost model (edgespec.planner.costs) --------------------------------------
    cost_window: int = 9          # samples kept per kind: the median of the most recent
    trusted_samples: int = 3      # in-run samples of a pass size or a drafter's step that outweigh its prior
    cold_start: float = 1.5       # (a step: when dearer than the prior by no more than this, a cold start)
    calibration_sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 9)  # 4 and 8: see CostModel._estimate_v
    long_sizes: tuple[int, ...] = (16, 32, 64)  # timed once when first wanted (AdaptivePlanner.timing_wanted)
    calibration_repeats: int = 5  # timed passes per size after one warm-up pass
    cost_prior_weight: int = 3    # samples a prior counts as when a run saves what it timed
    confirmed: float = 1.5        # a run's passes within this factor of the prior confirm it
    # -- the copying drafters (edgespec.drafters) -------------------------------------
    # How often a copy breaks after each run length (breaks.BreakModel's prior).
    run_priors: tuple[float, ...] = (0.36, 0.17, 0.10, 0.03, 0.02, 0.006, 0.005, 0.003, 0.002)
    resume_window: int = 256      # how far past a break a copy may pick up again
    resume_after: int = 8         # a copy that held this long in this text is picked up after a break
    prediction_longest_match: int = 16  # reply tokens compared when looking for a prediction's place again

    @property
    def saved_sizes(self) -> frozenset[int]:
        """The pass sizes a cost file keeps: the calibration's and the long ones."""
        return frozenset(self.calibration_sizes + self.long_sizes)


DEFAULT_CONFIG = PlannerConfig()
