"""The costs of a model pair on this machine, kept between runs.

A short calibration (:func:`calibrate`) times the target's short passes and each
draft model's step the first time a pair runs here; every run then starts from
the costs the last one saved (:func:`prior_for`, :func:`save_calibration`), so a
run's measurements, long passes included, become the next run's prior.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ..core.backend import Backend
from ..paths import edgespec_home, file_fingerprint
from ..core.cache import CachedModel
from ..core.config import DEFAULT_CONFIG
from .costs import CostModel
from ..core.sampling import SamplingParams, Scratch

Model = Backend | CachedModel  # what is timed: a backend, or the cache a generation uses
calibrations = 0  # run by this process (a server shows it in /metrics; tests read it)


def _backend(model: Model) -> Backend:
    return model.backend if isinstance(model, CachedModel) else model


def calibrate(target: Model, drafts: Sequence[tuple[str, Model]], *,
              sizes: Sequence[int] = DEFAULT_CONFIG.calibration_sizes,
              repeats: int = DEFAULT_CONFIG.calibration_repeats,
              clock: Callable[[], float] = time.perf_counter,
              context: Sequence[int] | None = None, keep: bool = False) -> CostModel:
    """Time target passes of ``sizes`` tokens and one-token drafter steps,
    interleaved (so a busy moment hits all alike), on ``clock`` (the engine's).

    The models are backends, or the caches a generation uses (a
    :class:`~edgespec.core.cache.CachedModel`: its list of cached tokens stays
    true). Each kind gets one warm-up pass (discarded) and ``repeats`` timed
    ones, read by their median. Runs after a short dummy context, or after
    ``context`` (a pass attends to all that is cached: over a few thousand tokens a
    64-token pass costs a fifth more), and leaves the caches empty, also when
    interrupted. With ``keep``, a cache that holds a conversation (a server's, timed
    while it is idle) is timed after it instead, and holds it again afterwards.
    """
    global calibrations
    calibrations += 1
    cost = CostModel()
    vocab = _backend(target).vocab
    token = 0 if vocab.bos_token_id is None else vocab.bos_token_id
    context = [token] * 16 if context is None else [int(t) for t in context]

    room = max(sizes) + 1
    # Where each model's passes are timed from: after what it holds (``keep``), else
    # after ``context``; and what it is left holding.
    held = {id(b): len(b.tokens) if keep and isinstance(b, CachedModel) and
            len(context) <= len(b.tokens) < _backend(b).n_ctx - room else 0
            for b in [target] + [b for _, b in drafts]}

    def timed(backend: Model, n: int) -> float:
        start = clock()
        backend.forward([token] * n)
        seconds = clock() - start
        backend.rewind(held[id(backend)] or len(context))
        return seconds

    try:
        for backend in [target] + [b for _, b in drafts]:
            if held[id(backend)]:
                continue
            backend.rewind(0)
            for start in range(0, len(context), 512):  # (a batch at a time)
                backend.forward(context[start:start + 512], last_only=True)
        for repeat in range(repeats + 1):
            warm_up = repeat == 0  # timed like the rest, and discarded
            for n in sorted(set(sizes) | {1}):
                seconds = timed(target, n)
                if not warm_up:
                    cost.observe_target(n, seconds)
            for name, backend in drafts:
                seconds = timed(backend, 1)
                if not warm_up:
                    cost.observe_draft(name, 1, seconds)
    finally:
        for backend in [target] + [b for _, b in drafts]:
            backend.rewind(held[id(backend)])
    return cost


class PassTimer:
    """Times target passes as a round's pass runs (every row's logits, verified
    greedily as if all but the first had been drafted), for a planner that wants the
    cost of pass sizes it has not measured (:func:`edgespec.planner.factory.time_long_passes`)."""

    def __init__(self, cache: CachedModel, clock: Callable[[], float] = time.perf_counter,
                 scratch: Scratch | None = None):
        self.cache, self.clock, self.scratch = cache, clock, scratch

    @staticmethod
    def sizes(wanted: Sequence[int], prompt_length: int) -> list[int]:
        """The passes to time in ``prompt_length`` tokens: the smallest sizes ``wanted``
        that fit in half of it, each after a one-token pass timed alike, and one more
        after the last (plain steps of the same moment, so a busy minute moves both sides
        of the ratio)."""
        sizes: list[int] = []
        for n in sorted(wanted):
            if 2 * (sum(sizes) + n + len(sizes) + 2) > prompt_length:
                break
            sizes.append(n)
        return [m for n in sizes for m in (1, n)] + [1] if sizes else []

    def time(self, tokens: Sequence[int]) -> float:
        """Seconds for a pass over ``tokens`` and the verification of its rows."""
        start = self.clock()
        logits = self.cache.verify_pass(tokens)
        self.cache.backend.verify(logits, tokens[1:], None, _GREEDY, None, confidence=False,
                                  scratch=self.scratch)
        return self.clock() - start


_GREEDY = SamplingParams(temperature=0)


def calibration_key(target: Backend, draft: Backend | None) -> str:
    """Identifies a model pair on this machine, for the calibration cache: the models
    by their content (as a saved profile is keyed), and how each runs here."""
    parts = [platform.node(), platform.machine(), platform.processor()]
    for backend in (target, draft):
        if backend is None:
            continue
        path = backend.path
        parts += [type(backend).__name__, file_fingerprint(path or backend.name),
                  str(backend.n_threads or ""), str(backend.n_gpu_layers)]
        if backend.rpc:  # its layers on other machines: other costs
            parts.append("rpc=" + ",".join(backend.rpc))
        if backend.bit_exact:  # other kernels, other costs: passes in
            parts.append(f"kernels=exact/{backend.exact_chunk}")  # pieces of this size
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def calibration_path(target: Backend, draft: Backend | None) -> Path:
    """Where the costs of this pair on this machine are cached."""
    # v3: only the sizes a run times on purpose are kept, each sample as a ratio to the
    # plain steps of its moment (v2 files could hold a 63-token pass timed once).
    return edgespec_home() / "calibration" / f"v3-{calibration_key(target, draft)}.json"


def load_calibration(path: Path) -> dict | None:
    """The cached ratios at ``path`` (None if missing or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("v"), dict):
        return None
    try:  # the CostModel clamps; here only check that the numbers are numbers
        for table in ("v", "c"):
            {str(k): float(v) for k, v in data.get(table, {}).items()}
        if any(int(n) < 1 for n in data["v"]):  # pass sizes: whole numbers of tokens
            return None
    except (TypeError, ValueError, AttributeError):
        return None
    return data


def pair_path(target: Model, drafts: Sequence[tuple[str, Model]]) -> Path:
    """Where the costs of ``target`` with its first draft model (if any) are kept."""
    return calibration_path(_backend(target), _backend(drafts[0][1]) if drafts else None)


def cached_prior(target: Model, drafts: Sequence[tuple[str, Model]]) -> dict | None:
    """The prior of this pair kept by an earlier run or calibration (None: none yet)."""
    prior = load_calibration(pair_path(target, drafts))
    return prior if prior and all(name in prior.get("c", {}) for name, _ in drafts) else None


def borrowed_prior(target: Model) -> dict:
    """What a pair not timed yet starts from when it may not be timed now (a server's
    request): the target's pass costs as another run kept them (its costs alone, or
    with no draft model), and no drafter's step cost; nothing if none was kept (then
    every pass is taken to cost its length in plain steps, and no drafting pays until
    the pair is timed)."""
    prior = load_calibration(pair_path(target, []))
    return {"v": prior["v"]} if prior else {}


def prior_for(target: Model, drafts: Sequence[tuple[str, Model]], *, keep: bool = False) -> dict:
    """The cached prior of this pair, or a new calibration (then cached; ``keep``: see
    :func:`calibrate`)."""
    path = pair_path(target, drafts)
    if (prior := cached_prior(target, drafts)) is not None:
        return prior
    prior = load_calibration(path)
    if prior is None and path.exists():
        print(f"edgespec: ignoring the cached costs {path}: not a calibration file "
              f"(measuring again, and rewriting it)", file=sys.stderr)
    prior = calibrate(target, drafts, keep=keep).as_prior()
    save_calibration(prior, path)
    return prior


def save_calibration(prior: dict, path: Path) -> None:
    """Write ``prior`` atomically (a read-only home only costs a calibration next time)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(prior))
        os.replace(tmp, path)
    except OSError:
        pass
