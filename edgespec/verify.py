"""The exact acceptance rule of speculative decoding (pure numpy, no models).

Notation, used throughout edgespec: **p** is the target's distribution, **q**
the drafter's, both after the same :func:`edgespec.sampling.logits_to_probs`.
For draft tokens x1..xk (Leviathan et al. 2023; Chen et al. 2023):

1. accept xi with probability min(1, p_i(xi) / q_i(xi));
2. at the first rejection, sample the replacement from norm(max(0, p_i - q_i));
3. if all k are accepted, sample a bonus token from p_{k+1}.

A deterministic drafter (prompt lookup) reports ``draft_probs=None``: q is
one-hot on the proposed token, so xi is accepted with probability p_i(xi) and
the replacement is drawn from p_i with xi removed. Either way, the tokens that
come out are distributed exactly as sampling from the target alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import sample_from


def rejection_sample(
    target_probs: np.ndarray,
    draft_token_ids: Sequence[int],
    draft_probs: np.ndarray | None,
    rng: np.random.Generator,
) -> list[int]:
    """Verify one round of drafts; return the accepted prefix plus one token.

    ``target_probs`` is ``[k+1, V]`` (row i is p at draft position i, row k the
    distribution after the last draft), ``draft_token_ids`` has length k, and
    ``draft_probs`` is ``[k, V]`` or ``None`` for a deterministic drafter.
    The result always has between 1 and k+1 tokens: the accepted drafts, then
    the correction (on rejection) or the bonus token (all accepted).
    """
    num_draft = len(draft_token_ids)
    if target_probs.shape[0] != num_draft + 1:
        raise ValueError(
            f"target_probs has {target_probs.shape[0]} rows for {num_draft} drafts; "
            f"need k+1 = {num_draft + 1}")
    if draft_probs is not None and draft_probs.shape[0] != num_draft:
        raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows for {num_draft} drafts")

    accepted: list[int] = []
    for i, token in enumerate(draft_token_ids):
        p = target_probs[i]  # [V]
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        # u * q < p  <=>  u < p / q, written without the division so q == 0 is safe.
        if rng.random() * q_token < p[token]:
            accepted.append(int(token))
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p - draft_probs[i], 0.0)
        if not residual.sum() > 0:
            # Only reachable through rounding when p == q; p is then the exact answer.
            residual = p
        accepted.append(sample_from(residual, rng))
        return accepted
    accepted.append(sample_from(target_probs[num_draft], rng))
    return accepted


def greedy_verify(target_argmax: Sequence[int], draft_token_ids: Sequence[int]) -> list[int]:
    """Temperature-0 verification: accept drafts while they equal the target's argmax.

    ``target_argmax`` has k+1 entries (the argmax at each draft position and
    after the last). Returns the accepted prefix plus the target's next token.
    """
    accepted: list[int] = []
    for i, token in enumerate(draft_token_ids):
        if int(target_argmax[i]) != int(token):
            break
        accepted.append(int(token))
    accepted.append(int(target_argmax[len(accepted)]))
    return accepted
