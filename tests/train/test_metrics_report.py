"""Metrics records (EpochMeter, MetricsLogger, RPC byte counters) and the distgnn-report plots."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest
from serving_graphs import small_graph

from distgnn.errors import ConfigError
from distgnn.rpc import RpcClient
from distgnn.train.cluster import LocalCluster
from distgnn.train.epoch import EpochSummary
from distgnn.train.metrics import (
    METRICS_FILE,
    MetricsLogger,
    RpcTraffic,
    add_metrics_args,
    epoch_record,
    metrics_from_args,
)
from distgnn.train.report import loss_series, read_records, stage_bars
from distgnn.train.report import main as report_main


class _FakeClient:
    def __init__(self) -> None:
        self.sent, self.received = 100, 1000

    def traffic(self) -> tuple[int, int]:
        return self.sent, self.received


def _summary(epoch: int, **changes) -> EpochSummary:
    fields = dict(loss=1.0, accuracy=0.5, time_s=2.0, sample_s=0.5, fetch_s=0.25, compute_s=1.0, wait_s=0.1)
    return EpochSummary(epoch, edges_per_s=30.0, **{**fields, **changes})


def test_an_epoch_record_holds_the_summary_and_the_rpc_bytes_of_the_epoch():
    client = _FakeClient()
    traffic = RpcTraffic(client)
    client.sent, client.received = 150, 1300
    record = epoch_record(_summary(2, cache_hits=3.0, cache_lookups=4.0, cache_peer_hits=0.0), 8, traffic.take())
    assert record == {
        "epoch": 2,
        "step": 8,
        "loss": 1.0,
        "acc": 0.5,
        "epoch_s": 2.0,
        "sample_s": 0.5,
        "fetch_s": 0.25,
        "compute_s": 1.0,
        "wait_s": 0.1,
        "edges_per_s": 30.0,
        "cache_hit_rate": 0.75,
        "rpc_sent_bytes": 50,
        "rpc_received_bytes": 300,
    }
    assert traffic.take() == (0, 0)  # counted from the last take
    assert epoch_record(_summary(0), 1)["cache_hit_rate"] is None


def test_the_rpc_client_counts_the_bytes_of_requests_and_replies(tmp_path):
    graph = small_graph(tmp_path / "g", num_parts=1, num_nodes=100, num_edges=300)
    with LocalCluster(graph.json_path, rpc_timeout_s=20) as cluster, RpcClient(cluster.config(0)) as client:
        before = client.traffic()
        ids = np.arange(50, dtype=np.int64)
        client.call(0, "pull", {"policy": "node", "name": "feat"}, [ids])
        sent, received = (a - b for a, b in zip(client.traffic(), before, strict=True))
    # Payload plus a small msgpack header each way.
    assert ids.nbytes < sent < ids.nbytes + 200
    assert 50 * 8 * 4 < received < 50 * 8 * 4 + 200


def test_only_rank_0_writes_json_lines(tmp_path):
    with MetricsLogger(tmp_path / "run", rank=1) as logger:
        logger.log_step(1, 0, loss=1.0)
    assert not (tmp_path / "run").exists()
    with MetricsLogger(tmp_path / "run", rank=0, every_n_steps=5) as logger:
        assert [s for s in range(1, 12) if logger.should_log_step(s)] == [5, 10]
        logger.log_step(5, 0, loss=1.5)
        logger.log_epoch(_summary(0, loss=1.25), step=8)
        with pytest.raises(ValueError, match="needs a 'step'"):
            logger.log("epoch", {"epoch": 1})
    lines = [json.loads(line) for line in (tmp_path / "run" / METRICS_FILE).read_text().splitlines()]
    assert [(r["kind"], r["step"], r["loss"]) for r in lines] == [("step", 5, 1.5), ("epoch", 8, 1.25)]


def test_tensorboard_missing_gives_one_warning_and_json_lines_still_work(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING), MetricsLogger(tmp_path, rank=0, tensorboard_dir=tmp_path / "tb") as logger:
        logger.log_step(1, 0, loss=2.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tensorboard package is not installed" in warnings[0].getMessage()
    assert (tmp_path / METRICS_FILE).read_text().count("\n") == 1


def test_metrics_flags(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_metrics_args(parser)
    assert metrics_from_args(parser.parse_args([])) is None
    with pytest.raises(ConfigError, match="need --run-dir"):
        metrics_from_args(parser.parse_args(["--tensorboard", str(tmp_path)]))
    logger = metrics_from_args(parser.parse_args(["--run-dir", str(tmp_path), "--metrics-every", "3"]), rank=0)
    assert logger.every_n_steps == 3 and logger.path == tmp_path / METRICS_FILE
    logger.close()


def _write_run(run_dir, epochs: int = 4, steps_per_epoch: int = 10) -> None:
    with MetricsLogger(run_dir, rank=0) as logger:
        for epoch in range(epochs):
            for i in range(1, steps_per_epoch + 1):
                step = epoch * steps_per_epoch + i
                logger.log_step(step, epoch, loss=2.0 / (1 + 0.1 * step), acc=min(0.95, 0.2 + 0.02 * step))
            summary = _summary(epoch, loss=2.0 / (1 + step / 10), time_s=1.7, sample_s=0.3, fetch_s=0.2 + 0.05 * epoch)
            logger.log_epoch(summary, step)
    # A resumed run repeats step 40 with another value, and a crash cut a line short.
    with open(run_dir / METRICS_FILE, "a") as f:
        f.write(json.dumps({"kind": "step", "time": 0, "step": 40, "epoch": 3, "loss": 0.123}) + "\n")
        f.write('{"kind": "step", "ste')


def test_records_keep_the_last_of_each_step_and_skip_a_cut_line(tmp_path):
    _write_run(tmp_path)
    records = read_records(tmp_path)
    steps = records["step"]
    assert [r["step"] for r in steps] == list(range(1, 41))
    assert steps[-1]["loss"] == 0.123
    assert [r["epoch"] for r in records["epoch"]] == [0, 1, 2, 3]


def test_report_plots_the_last_record_of_each_step_and_stacks_the_stages(tmp_path):
    """The data the two PNGs draw (the drawing itself needs matplotlib, not in the test extra)."""
    _write_run(tmp_path)
    records = read_records(tmp_path)
    series = loss_series(records)
    steps, losses = series["loss"]["step"]
    assert steps == list(range(1, 41)) and losses[-1] == 0.123  # the resumed run's value of step 40
    assert losses[:39] == pytest.approx([2.0 / (1 + 0.1 * step) for step in range(1, 40)])
    assert series["acc"]["step"][0] == list(range(1, 40))  # step 40's repeat has no accuracy
    assert series["loss"]["epoch"][0] == [10, 20, 30, 40] and series["acc"]["epoch"][1] == [0.5] * 4
    epochs, bars, epoch_s = stage_bars(records["epoch"])
    assert epochs == [0, 1, 2, 3] and epoch_s == [1.7] * 4
    assert list(bars) == ["sample_s", "fetch_s", "compute_s", "wait_s"]
    fetch = [0.2 + 0.05 * epoch for epoch in epochs]
    assert bars["sample_s"] == ([0.3] * 4, [0.0] * 4)
    assert bars["fetch_s"][0] == pytest.approx(fetch) and bars["fetch_s"][1] == pytest.approx([0.3] * 4)
    assert bars["compute_s"][1] == pytest.approx([0.3 + f for f in fetch])
    heights, bottoms = bars["wait_s"]
    assert [b + h for b, h in zip(bottoms, heights, strict=True)] == pytest.approx(
        [1.4 + f for f in fetch]
    )  # 0.3 + f + 1.0 + 0.1
    assert stage_bars([{"epoch": 0, "step": 1}]) == ([0], {s: ([0.0], [0.0]) for s in bars}, [0.0])


def test_report_draws_loss_and_stage_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _write_run(tmp_path)
    assert report_main([str(tmp_path), "--out", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    for name in ("loss.png", "stages.png"):
        path = tmp_path / "plots" / name
        assert f"wrote {path}" in out
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_report_without_metrics_says_so(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 1
    assert "no metrics file" in capsys.readouterr().err
