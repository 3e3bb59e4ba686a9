"""Can this drafter pair with this target? Every reason it cannot, in words.

After llama.cpp's ``common_speculative_are_compatible``: drafter and target
only meet at token ids, so they must agree on what each id means.
"""

from __future__ import annotations

import numpy as np

from ..core.backend import Backend
from ..errors import EdgespecError

# Vocabularies of one family may differ by a few padding rows in the output
# layer (e.g. 151936 vs 152064); llama.cpp tolerates up to 128 as well.
MAX_VOCAB_SIZE_DIFFERENCE = 128
TOKEN_TEXT_SAMPLE = 2000


def compatibility_problems(target: Backend, draft: Backend) -> list[str]:
    """Reasons why ``draft`` cannot draft for ``target`` (empty when they can)."""
    t, d = target.vocab, draft.vocab
    problems = []
    if t.kind != d.kind:
        problems.append(f"vocabulary type differs: target {t.kind}, draft {d.kind}")
    if abs(t.size - d.size) > MAX_VOCAB_SIZE_DIFFERENCE:
        problems.append(f"draft vocab {d.size} != target vocab {t.size} "
                        f"(more than {MAX_VOCAB_SIZE_DIFFERENCE} apart)")
    if t.bos_token_id != d.bos_token_id:
        problems.append(f"BOS differs: target adds {t.bos_token_id}, draft adds {d.bos_token_id}")
    if t.eos_token_ids != d.eos_token_ids:
        problems.append(f"end-of-generation tokens differ: target {sorted(t.eos_token_ids)[:5]}, "
                        f"draft {sorted(d.eos_token_ids)[:5]}")
    for label, token in t.special_token_ids.items():
        other = d.special_token_ids.get(label)
        if other is not None and other != token:
            problems.append(f"special token {label} differs: target {token}, draft {other}")
    shared = min(t.size, d.size)
    sample = np.unique(np.linspace(0, shared - 1, min(TOKEN_TEXT_SAMPLE, shared)).astype(int))
    mismatched = [int(i) for i in sample if target.token_text(int(i)) != draft.token_text(int(i))]
    if mismatched:
        i = mismatched[0]
        problems.append(
            f"token text differs on {len(mismatched)} of {len(sample)} sampled ids "
            f"(e.g. id {i}: target {target.token_text(i)!r}, draft {draft.token_text(i)!r})")
    return problems


def check_compatible(target: Backend, draft: Backend) -> None:
    """Raise :class:`EdgespecError` listing every reason the pair cannot work."""
    problems = compatibility_problems(target, draft)
    if problems:
        raise EdgespecError(
            f"drafter {draft.name} cannot pair with target {target.name}: "
            + "; ".join(problems)
            + ": pick a drafter from the same model family (see `edgespec pair check`)")
