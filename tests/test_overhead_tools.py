"""The table backend, the simulated GPU and the two benchmarks built on them."""

import numpy as np
import pytest

from edgespec.backends.simulated import DeviceClock, SimulatedDevice, gpu_batch_cost
from edgespec.backends.table import TableBackend
from edgespec.drafters import DraftModel
from edgespec.core.engine import Engine
from edgespec.core.sampling import SamplingParams
from run_script import run_script


def test_table_backend_rows_follow_positions_and_rewind():
    table = TableBackend.random(300, rows=8, seed=0)
    first = table.forward([1, 2, 3])
    assert first.shape == (3, 300) and table.n_past == 3
    np.testing.assert_array_equal(first, table.table[:3])
    wrapped = table.forward([4] * 7, last_only=True)  # position 9: row 9 % 8
    np.testing.assert_array_equal(wrapped, table.table[1:2])
    table.rewind(2)
    np.testing.assert_array_equal(table.forward([5, 6]), table.table[2:4])
    across = table.forward(list(range(6)))  # positions 4..9 wrap around the table's end
    np.testing.assert_array_equal(across, table.table[[4, 5, 6, 7, 0, 1]])


def test_simulated_device_charges_each_pass_to_the_clock():
    clock = DeviceClock()
    device = SimulatedDevice(TableBackend.random(100, seed=0), clock, step_seconds=0.008)
    device.forward([1])
    device.forward([1, 2, 3])
    assert clock.device_seconds == pytest.approx(0.008 * (1 + gpu_batch_cost(3)))
    assert device.passes == 2 and device.n_past == 4 and device.vocab.size == 100


def test_greedy_speculation_on_the_simulated_gpu_writes_plain_output_faster():
    clock = DeviceClock()
    table = TableBackend.random(2000, rows=200, seed=0)
    target = SimulatedDevice(table, clock, step_seconds=0.01)
    draft = SimulatedDevice(table.perturbed(noise=0.5, seed=1), clock, step_seconds=0.002)
    engine = Engine(target, None, num_draft=1, clock=clock)
    greedy = SamplingParams(temperature=0)
    plain = engine.generate(list(range(8)), greedy, max_tokens=100, speculative=False)
    engine.configure(DraftModel(draft), 4)
    spec = engine.generate(list(range(8)), greedy, max_tokens=100)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate > 0.5
    # Device time dominates here (10 ms steps): speculation must show in tok/s.
    assert spec.stats.tokens_per_second > 1.5 * plain.stats.tokens_per_second


def test_bench_overhead_prints_a_row_per_mode():
    out = run_script("bench_overhead.py", "--vocab", "4096", "--tokens", "40", "--repeats", "1")
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()
            if line.startswith(("plain", "draft model", "prompt lookup"))}
    assert set(rows) == {"plain", "draft model, k = 4", "prompt lookup, k = 4"}
    for line in rows.values():
        assert line.count(" ms") == 3  # T = 0, T = 0.7 exact and seed-invariant


def test_bench_simgpu_achieves_what_the_speed_model_predicts_less_host_work():
    out = run_script("bench_simgpu.py", "--vocab", "4096", "--tokens", "96", "--repeats", "1")
    fixed = [line.split() for line in out.splitlines() if line.startswith("draft k=")]
    assert len(fixed) == 4  # k = 2, 4 at T = 0, 0.7
    for cells in fixed:
        achieved, predicted, ratio = (float(x) for x in cells[3:6])
        assert predicted > 1.0
        # The host's work only adds to the device's: never far above the prediction.
        assert 0.5 < ratio <= 1.05, cells
    assert sum(line.startswith("auto") for line in out.splitlines()) == 2
