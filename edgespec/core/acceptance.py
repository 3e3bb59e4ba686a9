"""The exact acceptance rule of speculative decoding (array code, no models).

Notation, used throughout edgespec: **p** is the target's distribution, **q**
the drafter's, both after the same :func:`edgespec.core.sampling.logits_to_probs`.
For draft tokens x1..xk (Leviathan et al. 2023; Chen et al. 2023):

1. accept xi with probability min(1, p_i(xi) / q_i(xi));
2. at the first rejection, sample the replacement from norm(max(0, p_i - q_i));
3. if all k are accepted, sample a bonus token from p_{k+1}.

Every kind of round is decided the same way (:func:`keep_while_equal`): row i
of the target gives its own token t_i, the drafts are kept while t_i == x_i,
and the first t_i that differs (t_k after all k drafts) is committed. t_i is:

- at temperature 0, the argmax of p_i;
- with a :class:`~edgespec.core.coupling.Coupling` (seed-invariant sampling), the
  race's winner under p_i;
- for a deterministic drafter (prompt lookup, the suffix drafter:
  ``draft_probs=None``, q one-hot), a sample of p_i. That is rule 1 and 2 for a
  one-hot q (t_i == x_i with probability p_i(x_i); otherwise t_i is drawn from
  p_i given "not x_i": the residual), as llama.cpp does it: every committed
  token is drawn as plain sampling draws it, so with one seed such a drafter
  reproduces plain sampling's tokens (up to the rounding of a batched pass
  against a one-token pass);
- for a draft model, x_i if u_i · q_i(x_i) < p_i(x_i) (:func:`accepts`), else a
  sample of the residual (:func:`~edgespec.core.sampling.residual`, which is 0
  at x_i then); t_k a sample of p_k.

The tokens that come out are distributed exactly as sampling from the target
alone. The t_i are computed in one of two orders, from the same pieces (these
functions, :func:`~edgespec.core.sampling.logits_to_probs`,
:func:`~edgespec.core.coupling.race_rows`), as array code for numpy or MLX
(:mod:`edgespec.core.arrays`): on the host row by row, stopping at the first
t_i != x_i (:func:`rejection_sample`: a row over 150k ids is the host's cost per
token, and the rows after a rejection are never computed); on a device every
row at once (:func:`own_tokens`: a round trip to the host per row would cost
more than the arithmetic; the draws after the first difference go unused, so
the verdict is distributed as the sequential one's).

A drafter whose vocabulary has a few more rows than the target's may propose
an id the target lacks. p is 0 there, so that draft is rejected for certain
and the replacement comes from the residual over the target's ids. The target
cannot evaluate such an id, so the draft is verified only up to it:
:func:`runnable_drafts` says how many drafts to run the target on, and the
verifiers accept ``k`` rows of target probabilities (instead of ``k + 1``)
when the last draft is not run: out of the target's vocabulary, or refused by a
request's grammar (:mod:`edgespec.core.shaping`), where p is 0 after the mask. It
stays in the draft, rejected for certain, so that the replacement comes from
the residual: cutting a draft model's draft at a token because of its value
would not be exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .arrays import namespace
from .coupling import Coupling
from .sampling import ProbRows, SamplingParams, Scratch, logits_to_probs, residual, top_probability


@dataclass(frozen=True)
class Verdict:
    """What a verified round commits: the accepted drafts, then one token of the
    target's own (the recovered token after a rejection, or the bonus token
    after all drafts were accepted)."""

    accepted_token_ids: list[int]
    next_token_id: int

    @property
    def num_accepted(self) -> int:
        """How many draft tokens were accepted."""
        return len(self.accepted_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Every token the round commits, in order."""
        return [*self.accepted_token_ids, self.next_token_id]


def runnable_drafts(draft_token_ids: Sequence[int], vocab_size: int) -> int:
    """How many leading drafts the target can evaluate (all ids below ``vocab_size``)."""
    for i, token in enumerate(draft_token_ids):
        if not 0 <= token < vocab_size:
            return i
    return len(draft_token_ids)


def _check_rows(rows: int, draft_token_ids: Sequence[int], vocab_size: int) -> None:
    num_draft = len(draft_token_ids)
    runnable = runnable_drafts(draft_token_ids, vocab_size)
    # The target runs on the last committed token and every draft it can evaluate;
    # a last draft a request's grammar refuses is not run either (k rows: its p is 0).
    expected = {runnable + 1, num_draft} if runnable >= num_draft - 1 else set()
    if rows not in expected or rows < 1:
        raise ValueError(
            f"target rows: got {rows} for {num_draft} drafts; need k+1 = {num_draft + 1} "
            f"(or k when the last draft was not run: outside the target's vocabulary of "
            f"{vocab_size}, or refused by a grammar)")


def keep_while_equal(own_token_ids, draft_token_ids: Sequence[int]) -> Verdict:
    """The rule's last step, in every kind of round: keep the drafts while each equals
    the target's own token at its row, then commit the first own token that differs
    (or the one after the last draft). ``own_token_ids`` may be lazy (an iterator):
    it is read only that far."""
    own = iter(own_token_ids)
    accepted: list[int] = []
    for token in draft_token_ids:
        mine = int(next(own))
        if mine != int(token):
            return Verdict(accepted, mine)
        accepted.append(int(token))
    return Verdict(accepted, int(next(own)))


def greedy_verify(target_argmax: Sequence[int], draft_token_ids: Sequence[int]) -> Verdict:
    """Temperature-0 verification: accept drafts while they equal the target's argmax
    (:func:`keep_while_equal`).

    ``target_argmax`` has k+1 entries (the argmax at each draft position and
    after the last), or k when the last draft is outside the target's
    vocabulary (it never equals an argmax). The target's next token follows
    the accepted prefix.
    """
    return keep_while_equal(target_argmax, draft_token_ids)


def accepts(u, q_x, p_x):
    """Whether a draft x is kept, with probability min(1, p(x) / q(x)) for a uniform
    ``u`` in [0, 1): u · q < p, written without the division so q == 0 is safe (an
    array of verdicts for arrays)."""
    return u * q_x < p_x


def fit_vocab(draft_probs, vocab_size: int):
    """q ``[k, V']`` over the target's vocabulary: ids the target lacks have p = 0, so
    dropping their columns leaves max(p - q, 0) unchanged; missing ids get q = 0."""
    width = draft_probs.shape[-1]
    if width > vocab_size:
        return draft_probs[:, :vocab_size]
    if width < vocab_size:
        return namespace(draft_probs).pad(draft_probs, [(0, 0), (0, vocab_size - width)])
    return draft_probs


def _draft_q(draft_probs, num_draft: int, vocab_size: int):
    """q ``[k, V]`` of a round's drafts, checked and over the target's vocabulary."""
    if draft_probs.shape[0] != num_draft:
        raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows for {num_draft} drafts")
    return fit_vocab(draft_probs, vocab_size)


def rejection_sample(
    target_probs: np.ndarray,
    draft_token_ids: Sequence[int],
    draft_probs: np.ndarray | None,
    rng,
    *,
    draft_scales: Sequence[float] | None = None,
    position: int = 0,
) -> Verdict:
    """Verify one round of drafts on the host, row by row: the accepted prefix, then
    the target's own token.

    ``target_probs`` is ``[k+1, V]`` (row i is p at draft position i, row k the
    distribution after the last draft; an array, or a
    :class:`~edgespec.core.sampling.ProbRows` that computes only the rows read),
    ``draft_token_ids`` has length k, and ``draft_probs`` is ``[k, V']`` or ``None`` for a deterministic drafter.
    ``V'`` may differ from ``V``: q of ids the target lacks cannot matter (p is
    0 there), and ids only the target has get q = 0. With k = 0 this samples
    one token from ``target_probs[0]``: a plain step. ``draft_scales``: a factor
    per row when ``draft_probs`` holds q only up to it (q = probs × scale, as a
    drafter that skipped normalising its rows reports them).

    ``rng``: an ``np.random.Generator``, or a :class:`~edgespec.core.coupling.Coupling`
    for seed-invariant sampling: then the target's own token at each row is the
    one the coupling's noise decides at its context position (row 0 at
    ``position``), and a draft is kept while it equals it, whatever q (drafts made
    under the same noise mostly do).
    """
    num_draft = len(draft_token_ids)
    vocab_size = target_probs.shape[-1]
    _check_rows(target_probs.shape[0], draft_token_ids, vocab_size)
    rows = target_probs if isinstance(target_probs, ProbRows) else ProbRows.of_probs(target_probs)
    if draft_probs is not None and not isinstance(rng, Coupling):
        draft_probs = _draft_q(draft_probs, num_draft, vocab_size)
    return keep_while_equal(_own_tokens_in_turn(rows, draft_token_ids, draft_probs, rng, draft_scales,
                                                position), draft_token_ids)


def _own_tokens_in_turn(rows: ProbRows, draft_token_ids, draft_probs, rng, draft_scales, position):
    """The target's own tokens t_i of :func:`rejection_sample`, each computed when read."""
    num_draft = len(draft_token_ids)
    if isinstance(rng, Coupling):  # the noise decides; a draft is kept if equal
        yield from (rows.pick(i, rng, position + i) for i in range(num_draft + 1))
    elif draft_probs is None:  # q one-hot: the target samples its own token
        yield from (rows.sample(i, rng) for i in range(num_draft + 1))  # p(token) = 0: never equal
    else:
        for i, token in enumerate(draft_token_ids):
            q, q_scale = draft_probs[i], 1.0 if draft_scales is None else float(draft_scales[i])
            # An id the target lacks (p = 0) is rejected for certain, with no uniform drawn.
            if token < rows.shape[-1] and accepts(rng.random(), float(q[token]) * q_scale, rows.prob(i, token)):
                yield token
            else:
                yield rows.sample_residual(i, q, rng, q_scale)
        yield rows.sample(num_draft, rng)


def own_tokens(logits, draft_token_ids: Sequence[int], draft_probs, params: SamplingParams, rng,
               draws=None, *, draft_scales=None, position: int = 0):
    """The target's own token t_i at every row of ``logits [n, V]`` at once, and its
    top probability at each row: the verdict is :func:`keep_while_equal` of them.

    Array code for any namespace, evaluated by no one here: on MLX, the device's
    verification (:func:`edgespec.backends.mlx_ops.verify_on_device`), which brings the
    two arrays to the host together. The arguments are :func:`verify_round`'s;
    ``draws``: where random draws come from when ``rng`` is a generator (a
    :class:`Draws`; not used at temperature 0 or with a Coupling).
    """
    num_draft, vocab = len(draft_token_ids), logits.shape[-1]
    _check_rows(logits.shape[0], draft_token_ids, vocab)
    xp = namespace(logits)
    if params.greedy:
        return xp.argmax(logits, axis=-1), top_probability(logits)
    p = logits_to_probs(logits, params)  # [n, V]
    top = p.max(axis=-1)
    if isinstance(rng, Coupling):
        return rng.picks(p, position), top
    if draft_probs is None or not num_draft:  # a deterministic drafter's round, or a plain step
        return draws.each(p), top
    q = _draft_q(xp.asarray(draft_probs), num_draft, vocab)
    if draft_scales is not None:
        q = q * xp.asarray(np.asarray(draft_scales, np.float32))[:, None]
    ids = xp.asarray(np.asarray(draft_token_ids, np.int32))
    column = xp.minimum(ids, vocab - 1)[:, None]  # (an id the target lacks has p = 0)
    p_x = xp.where(ids < vocab, xp.take_along_axis(p[:num_draft], column, axis=-1)[:, 0], 0.0)
    q_x = xp.take_along_axis(q, column, axis=-1)[:, 0]
    remaining = residual(p[:num_draft], q)
    remaining = xp.where(remaining.sum(axis=-1, keepdims=True) > 0, remaining, p[:num_draft])
    recovered = draws.draw(xp.concatenate([remaining, p[num_draft:]], axis=0))  # [n]
    kept = xp.where(accepts(draws.uniform(num_draft), q_x, p_x), ids, recovered[:num_draft])
    return xp.concatenate([kept, recovered[num_draft:]], axis=0), top


class Draws(Protocol):
    """What :func:`own_tokens` draws at random, in its arrays' namespace (on a device,
    from the device's generator): :meth:`each`, a sample of each row as a plain step
    at its position would draw it; :meth:`uniform` and :meth:`draw`, a draft model's
    round's uniforms and its replacement and bonus tokens."""

    def each(self, probs):
        """One token id from each row of ``probs [n, V]``, as plain steps would draw them."""

    def uniform(self, count: int):
        """``count`` uniforms in [0, 1)."""

    def draw(self, weights):
        """One token id from each row of non-negative ``weights [n, V]`` (unnormalised)."""


def verify_round(logits: np.ndarray, draft_token_ids: Sequence[int], draft_probs, params: SamplingParams,
                 rng, *, draft_scales: np.ndarray | None = None, confidence: bool = True,
                 scratch: Scratch | None = None, position: int = 0) -> tuple[Verdict, np.ndarray]:
    """The verdict on a round from the target's rows of logits ``[n, V]``, on the
    host, and the target's top probability at each token it commits (for the
    planner; empty without ``confidence``). Greedy, or :func:`rejection_sample`
    over rows computed as it reads them. ``draft_scales``, ``rng`` and
    ``position``: as for :func:`rejection_sample`. ``scratch``: where the
    target's rows are computed (the caller's, reused round after round).

    This is :meth:`Backend.verify <edgespec.core.backend.Backend.verify>` for every
    backend whose logits come to the host (:class:`HostVerify`); MLX's computes the
    same rule's tokens on its device (:func:`own_tokens`).
    """
    logits = np.asarray(logits)
    if draft_probs is not None and not isinstance(draft_probs, np.ndarray):
        draft_probs = np.array(draft_probs)  # q from a device drafter, for a host target
    if params.greedy:
        verdict = greedy_verify(np.argmax(logits, axis=-1), draft_token_ids)
        rows = logits[:verdict.num_accepted + 1] if confidence else logits[:0]
        return verdict, top_probability(rows, scratch)
    target_probs = ProbRows(logits, params, scratch)  # [n, V], rows computed as read
    verdict = rejection_sample(target_probs, draft_token_ids, draft_probs, rng, draft_scales=draft_scales,
                               position=position)
    return verdict, target_probs.top(verdict.num_accepted + 1 if confidence else 0)


class HostVerify:
    """``Backend.verify`` of a backend whose logits come to the host: :func:`verify_round`."""

    def verify(self, logits, draft_token_ids: Sequence[int], draft_probs, params: SamplingParams,
               rng, *, draft_scales: np.ndarray | None = None, position: int = 0,
               confidence: bool = True, scratch: Scratch | None = None) -> tuple[Verdict, np.ndarray]:
        """The verdict on a round from this backend's rows of logits (see :func:`verify_round`)."""
        return verify_round(logits, draft_token_ids, draft_probs, params, rng, draft_scales=draft_scales,
                            confidence=confidence, scratch=scratch, position=position)
