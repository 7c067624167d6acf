"""distgnn.train.epoch: per-stage epoch times, loss/accuracy sums, cross-trainer reductions, RESULT fields."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distgnn.errors import InputError
from distgnn.loader.node import MiniBatch
from distgnn.train import epoch as epoch_module
from distgnn.train.epoch import EpochMeter, EpochSummary, TrainingLog, all_reduce
from distgnn.train.timeline import Timeline


def batches(n: int, closed: list[bool]):
    try:
        for i in range(n):
            seeds = torch.arange(4)
            yield MiniBatch(seeds, seeds, [], timing={"sample": 0.5 + i, "fetch": 0.25})
    finally:
        closed.append(True)


def inputs(batch):
    return batch, torch.ones(4, 2), torch.tensor([0, 1, 1, 1])


class FakeCache:
    def __init__(self, hits: int, lookups: int, peer: int) -> None:
        self.cache_hits, self.lookups, self.peer_hits = hits, lookups, peer
        self.resets = 0

    def reset_stats(self) -> None:
        self.resets += 1


def test_an_epoch_sums_the_loaders_stage_times_and_the_mean_loss_and_accuracy() -> None:
    closed: list[bool] = []
    meter = EpochMeter(2, 3, torch.device("cpu"))
    losses = [1.0, 2.0, 6.0]
    for step, (batch, x, y) in enumerate(meter.steps(batches(10, closed), inputs)):
        assert x.shape == (4, 2) and len(batch[1]) == 4
        meter.step_done(torch.tensor(losses[step]), len(y), edges=10 * (step + 1), correct=(y == 1).sum())
    assert closed == [True]  # the seven batches left were dropped with the loader's iterator
    cache = FakeCache(30, 40, 5)
    summary = meter.finish(cache)
    assert summary.epoch == 2 and cache.resets == 1
    assert summary.loss == pytest.approx(3.0) and summary.accuracy == pytest.approx(0.75)
    assert summary.sample_s == pytest.approx(0.5 + 1.5 + 2.5) and summary.fetch_s >= 0.75
    assert summary.fetch_s < 0.75 + summary.wait_s + 1e-9 and summary.compute_s >= 0
    assert summary.time_s >= summary.wait_s + summary.compute_s - 1e-6
    assert summary.edges_per_s == pytest.approx(60 / summary.time_s)
    assert (summary.cache_hits, summary.cache_lookups, summary.cache_peer_hits) == (30, 40, 5)
    line = summary.line()
    assert line.startswith("epoch   2 | loss 3.0000 | train acc 0.7500 | time ") and line.endswith("cache hit 75.0%")
    assert float(line.split("|")[1].split()[1]) == pytest.approx(summary.loss, abs=1e-4)


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_the_collector_runs_only_every_gc_every_steps_and_is_restored_after() -> None:
    import gc
    import weakref

    assert gc.isenabled()
    meter = EpochMeter(0, 7, torch.device("cpu"), gc_every=3)
    freed_at: list[int | None] = []
    for step, (_, _, y) in enumerate(meter.steps(batches(10, []), inputs)):
        assert not gc.isenabled()  # no collection on its own during the steps
        if step == 0:
            assert gc.get_freeze_count() > 0  # what existed before training is never walked again
        garbage = weakref.ref(_Cycle())
        meter.step_done(torch.tensor(1.0), len(y), edges=1)
        freed_at.append(garbage() is None)
    assert gc.isenabled()  # as before, also when the epoch ends
    # Cycles made in steps 0-2 are freed by the collection after step 2 (index 2), 3-5 after step 5.
    assert freed_at == [False, False, True, False, False, True, False]
    meter.finish()
    assert gc.isenabled()
    off = EpochMeter(0, 2, torch.device("cpu"))  # gc_every=0: left alone
    for _, _, y in off.steps(batches(2, []), inputs):
        assert gc.isenabled()
        off.step_done(torch.tensor(1.0), len(y), edges=1)


def test_an_exception_in_a_step_restores_automatic_collection() -> None:
    import gc

    meter = EpochMeter(0, 5, torch.device("cpu"), gc_every=2)
    with pytest.raises(RuntimeError, match="boom"):
        for _ in meter.steps(batches(5, []), inputs):
            raise RuntimeError("boom")
    assert gc.isenabled()  # the steps' generator closed as the exception left the loop
    meter.finish()
    assert gc.isenabled()
    with pytest.raises(ValueError, match="every"):
        EpochMeter(0, 1, torch.device("cpu"), gc_every=-1)


class _Clock:
    """``time.perf_counter`` that moves only when told: timings exact however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_marks_split_the_compute_into_forward_backward_and_optimizer(monkeypatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(epoch_module, "time", clock)
    meter = EpochMeter(0, 2, torch.device("cpu"))
    for _, _, y in meter.steps(batches(2, []), inputs):
        clock.sleep(0.02)
        meter.mark("forward")
        clock.sleep(0.04)
        meter.mark("backward")
        clock.sleep(0.01)
        meter.step_done(torch.tensor(1.0), len(y), edges=1)
    summary = meter.finish()
    assert summary.forward_s == pytest.approx(0.04, abs=1e-9)
    assert summary.backward_s == pytest.approx(0.08, abs=1e-9)
    assert summary.optimizer_s == pytest.approx(0.02, abs=1e-9)
    parts = summary.forward_s + summary.backward_s + summary.optimizer_s
    assert parts == pytest.approx(summary.compute_s, abs=1e-6)
    split = TrainingLog()
    split.add(summary)
    assert split.result()["stage_split_s"][0][2:5] == [round(t, 4) for t in summary.stage_split[2:5]]
    with pytest.raises(InputError, match="'forward' or 'backward'"):
        meter.mark("optimizer")


def test_an_unmarked_loop_has_no_compute_split() -> None:
    meter = EpochMeter(0, 1, torch.device("cpu"))
    for _, _, y in meter.steps(batches(1, []), inputs):
        meter.step_done(torch.tensor(1.0), len(y), edges=1)
    summary = meter.finish()
    assert summary.forward_s == summary.backward_s == summary.optimizer_s == 0.0 and summary.compute_s > 0


def test_a_timeline_gets_each_steps_wait_fetch_and_compute_spans() -> None:
    timeline = Timeline("cpu")
    meter = EpochMeter(1, 2, "cpu", timeline=timeline)
    for _batch, _x, y in meter.steps(batches(5, []), inputs):
        time.sleep(0.003)  # the step's compute
        meter.step_done(torch.tensor(1.0), len(y), edges=1)
    records = timeline.records()
    assert [(r["epoch"], r["batch"]) for r in records] == [(1, 0), (1, 1)]
    for record in records:
        assert [s["stage"] for s in record["spans"]] == ["wait", "fetch", "compute"]
        compute = record["spans"][2]["host_ms"]
        assert compute[1] - compute[0] >= 3.0
        edges = [t for s in record["spans"] for t in s["host_ms"]]
        assert edges == sorted(edges)


def test_without_counted_predictions_there_is_no_accuracy() -> None:
    meter = EpochMeter(0, 1, "cpu")
    for _batch, _x, _y in meter.steps(batches(1, []), inputs):
        meter.step_done(torch.tensor(0.5), 4, 1)
    summary = meter.finish()
    assert summary.accuracy is None and "train acc" not in summary.line() and "cache" not in summary.line()


def summary(epoch: int, time_s: float, loss: float, cache=(None, None, None)) -> EpochSummary:
    return EpochSummary(epoch, loss, None, time_s, 1.0, 2.0, 3.0, 4.0, 100.0 / time_s, *cache)


def test_the_log_reports_medians_the_last_loss_and_the_cache_rates() -> None:
    log = TrainingLog()
    for epoch, (t, hits, lookups, peer) in enumerate([(1.0, 5, 10, 1), (3.0, 9, 10, 3), (2.0, 10, 20, 0)]):
        log.add(summary(epoch, t, 1.0 / (epoch + 1), (hits, lookups, peer)))
    result = log.result()
    # The epoch time is the median after the first epoch: of 3.0 and 2.0.
    assert result["epoch_time_s"] == 2.5 and result["epoch_times_s"] == [1.0, 3.0, 2.0]
    assert result["stage_times_s"] == [[1.0, 2.0, 3.0, 4.0]] * 3
    assert result["seps"] == 50.0 and result["train_loss"] == pytest.approx(1 / 3)
    assert result["cache_hit_rate"] == pytest.approx(24 / 40) and result["cache_peer_hit_rate"] == pytest.approx(4 / 40)


def test_an_empty_or_uncached_log_has_no_rates() -> None:
    assert TrainingLog().result()["epoch_time_s"] is None
    log = TrainingLog()
    log.add(summary(0, 1.0, 0.5))
    assert log.result()["cache_hit_rate"] is None and log.result()["cache_peer_hit_rate"] is None


def test_all_reduce_is_the_identity_in_one_process() -> None:
    assert all_reduce([1.5, 2.0], "max") == [1.5, 2.0]


def _two_trainers(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        meter = EpochMeter(0, 1, "cpu")
        for _batch, _x, _y in meter.steps(batches(1, []), inputs):
            meter.step_done(torch.tensor(1.0 + 3 * rank), 4, 10, torch.tensor(rank))
        result = meter.finish(FakeCache(1 + rank, 2, 0))
        out.put((rank, result, all_reduce([float(rank), 10.0 - rank], "max")))
    finally:
        dist.destroy_process_group()


def test_trainers_sum_loss_samples_edges_and_cache_counts_and_keep_the_slowest_times(tmp_path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_two_trainers, args=(r, f"file://{tmp_path}/init", out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((rank, (s, m)) for rank, s, m in (out.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(30)
    (first, max0), (second, max1) = results[0], results[1]
    assert max0 == max1 == [1.0, 10.0]
    assert first == second  # every trainer reports the same epoch
    assert first.loss == pytest.approx((1.0 * 4 + 4.0 * 4) / 8) and first.accuracy == pytest.approx(1 / 8)
    assert first.sample_s == 0.5 and (first.cache_hits, first.cache_lookups) == (3, 4)
    assert first.edges_per_s == pytest.approx(20 / first.time_s)
