"""A simulated accelerator: model passes that take the time a GPU would.

:class:`SimulatedDevice` wraps any backend (usually a cheap
:class:`~edgespec.backends.table.TableBackend`) and charges each forward pass
``step_seconds · batch_cost(n)`` of device time on a :class:`DeviceClock`,
which reads real host time plus the device time charged so far. Give the same
clock to the :class:`~edgespec.core.engine.Engine`: what it measures is then
edgespec's real host work plus the passes of a GPU that runs one pass at a
time and never overlaps the host (as a single llama.cpp or MLX stream does).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np


class DeviceClock:
    """Host seconds (``time.perf_counter``) plus simulated device seconds."""

    def __init__(self) -> None:
        self.device_seconds = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.device_seconds

    def advance(self, seconds: float) -> None:
        self.device_seconds += seconds


def gpu_batch_cost(n: int) -> float:
    """v(n) of a small model on a GPU: a pass over n tokens costs little more than one
    (memory-bound: the weights are read once however many tokens share them)."""
    return 1.0 + 0.05 * (n - 1)


class SimulatedDevice:
    """``inner``'s logits, with each pass charged to ``clock`` as a GPU would take it."""

    def __init__(self, inner, clock: DeviceClock, *, step_seconds: float,
                 batch_cost: Callable[[int], float] = gpu_batch_cost):
        self.inner, self.clock = inner, clock
        self.step_seconds, self.batch_cost = step_seconds, batch_cost
        self.passes = 0

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        logits = self.inner.forward(tokens, last_only=last_only)
        self.clock.advance(self.step_seconds * self.batch_cost(len(tokens)))
        self.passes += 1
        return logits

    def __getattr__(self, name: str):  # name, vocab, n_ctx, n_past, rewind, tokenize, ...
        return getattr(self.inner, name)
