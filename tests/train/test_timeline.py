"""The per-batch stage timeline: spans per batch, JSON round trip, profiler trace, plot (CUDA events on a GPU)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from distgnn.errors import InputError
from distgnn.train.timeline import Timeline, plot_timeline, read_timeline, summarize, timeline_panels


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def recorded(device: str, batches: int = 3) -> Timeline:
    timeline = Timeline(device)
    for step in range(batches):
        timeline.begin_batch(0, step)
        with timeline.span("sample"):
            busy(0.002)
        with timeline.span("compute"):
            busy(0.004 * (step + 1))
    return timeline


def test_spans_are_recorded_per_batch_in_order_with_host_intervals():
    records = recorded("cpu").records()
    assert [(r["epoch"], r["batch"]) for r in records] == [(0, 0), (0, 1), (0, 2)]
    ends = []
    for step, record in enumerate(records):
        assert [s["stage"] for s in record["spans"]] == ["sample", "compute"]
        for span in record["spans"]:
            begin, end = span["host_ms"]
            assert span["gpu_ms"] is None
            assert begin < end
            ends += [begin, end]
        compute = record["spans"][1]["host_ms"]
        assert compute[1] - compute[0] >= 4 * (step + 1)
    assert ends == sorted(ends)  # spans follow each other


def test_summary_adds_each_stage_over_batches():
    summary = recorded("cpu").summary()
    assert set(summary) == {"sample", "compute", "all"}
    assert summary["compute"]["host_ms"] >= 4 + 8 + 12 and summary["compute"]["count"] == 3
    assert 6 <= summary["sample"]["host_ms"] < summary["compute"]["host_ms"]
    assert summary["all"]["wall_ms"] >= summary["sample"]["host_ms"] + summary["compute"]["host_ms"]
    assert summary["compute"]["gpu_ms"] != summary["compute"]["gpu_ms"]  # NaN: no GPU intervals


def test_gpu_busy_time_is_the_union_of_overlapping_intervals():
    def span(stage, gpu):
        return {"stage": stage, "host_ms": [0.0, 1.0], "gpu_ms": gpu}

    batches = [
        {"epoch": 0, "batch": 0, "spans": [span("sample", [0.0, 4.0]), span("compute", [2.0, 6.0])]},
        {"epoch": 1, "batch": 0, "spans": [span("compute", [10.0, 11.0]), span("fetch", [10.5, 10.7])]},
    ]
    summary = summarize(batches)
    assert summary["all"]["gpu_busy_ms"] == pytest.approx(6.0 + 1.0)
    assert summary["compute"]["gpu_ms"] == pytest.approx(5.0) and summary["compute"]["count"] == 2
    assert summarize(batches, epochs={1})["all"]["gpu_busy_ms"] == pytest.approx(1.0)


def test_added_spans_land_in_the_current_batch():
    timeline = Timeline("cpu")
    timeline.begin_batch(2, 7)
    now = time.perf_counter()
    timeline.add_span("wait", now, now + 0.003)
    [record] = timeline.records()
    assert record["epoch"] == 2 and record["spans"][0]["stage"] == "wait"
    begin, end = record["spans"][0]["host_ms"]
    assert end - begin == pytest.approx(3.0, abs=1e-3)


def test_a_span_before_any_batch_is_refused():
    timeline = Timeline("cpu")
    with pytest.raises(InputError, match="begin_batch"), timeline.span("sample"):
        pass
    with pytest.raises(InputError, match="begin_batch"):
        timeline.add_span("wait", 0.0, 1.0)


def test_json_round_trip_and_version_check(tmp_path):
    timeline = recorded("cpu", batches=2)
    path = tmp_path / "timeline.json"
    timeline.write_json(path, run="test", batch_size=4)
    document = read_timeline(path)
    origin = document["meta"].pop("origin_s")
    assert document["meta"] == {"run": "test", "batch_size": 4}
    assert 0 < origin <= time.perf_counter()
    assert document["batches"] == timeline.records()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format_version": 99, "batches": []}))
    with pytest.raises(InputError, match="format_version"):
        read_timeline(bad)


def test_profiler_trace_names_the_stages(tmp_path):
    trace = tmp_path / "trace.json"
    with Timeline("cpu", trace_path=trace) as timeline:
        timeline.begin_batch(0, 0)
        with timeline.span("compute"):
            torch.randn(64, 64) @ torch.randn(64, 64)
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert "distgnn.compute" in names


def _span(stage: str, host: list[float], gpu: list[float] | None = None) -> dict:
    return {"stage": stage, "host_ms": host, "gpu_ms": gpu}


def test_plot_data_places_spans_by_the_chosen_clock_and_sums_each_stage_per_batch():
    """What the timeline image draws (the drawing itself needs matplotlib, not in the test extra)."""
    document = {
        "batches": [
            {"spans": [_span("fetch", [0, 2]), _span("compute", [2, 5], [2.5, 4.5]), _span("fetch", [5, 6])]},
            {"spans": [_span("compute", [6, 16], [7, 15])]},
        ]
    }
    gpu = timeline_panels(document)
    assert gpu["use_gpu"] and gpu["stages"] == ["fetch", "compute"]
    assert gpu["lanes"] == {"fetch": [(0, 2), (5, 1)], "compute": [(2.5, 2.0), (7, 8)]}  # no GPU interval: host
    assert gpu["per_batch"] == {"fetch": [3, 0], "compute": [2.0, 8]}
    assert gpu["ylim"] == 24  # 3 x the 99th percentile of every stage's per-batch ms
    host = timeline_panels(document, clock="host")
    assert not host["use_gpu"] and host["lanes"]["compute"] == [(2, 3), (6, 10)]
    assert host["per_batch"]["compute"] == [3, 10] and host["ylim"] == 30
    assert not timeline_panels({"batches": [{"spans": [_span("fetch", [0, 1])]}]})["use_gpu"]
    assert timeline_panels({"batches": []})["ylim"] is None
    with pytest.raises(InputError, match="clock must be 'auto', 'gpu' or 'host', got 'wall'"):
        timeline_panels(document, clock="wall")


def test_plot_draws_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    timeline = recorded("cpu")
    path = tmp_path / "timeline.json"
    timeline.write_json(path)
    image = tmp_path / "timeline.png"
    plot_timeline(read_timeline(path), image)
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError, match="clock"):
        plot_timeline(read_timeline(path), image, clock="wall")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_intervals_come_from_cuda_events_without_host_waits():
    torch.cuda._sleep(1)  # the first launch loads the kernel (7 ms once, on an H100): not what is timed
    torch.cuda.synchronize()
    timeline = Timeline("cuda")
    timeline.begin_batch(0, 0)
    with timeline.span("compute"):
        torch.cuda._sleep(50_000_000)  # tens of ms of GPU time, returns at once
    with timeline.span("fetch"):
        pass
    [record] = timeline.records()
    compute, fetch = record["spans"]
    gpu_compute = compute["gpu_ms"][1] - compute["gpu_ms"][0]
    host_compute = compute["host_ms"][1] - compute["host_ms"][0]
    assert gpu_compute > 5 > host_compute  # the host only launched it
    assert fetch["gpu_ms"][0] >= compute["gpu_ms"][1]  # the empty span waits its turn on the stream


def test_timeline_flags_make_one_per_rank_with_its_own_path(tmp_path):
    import argparse

    from distgnn.errors import ConfigError
    from distgnn.train.timeline import add_timeline_args, read_timeline, timeline_from_args

    parser = argparse.ArgumentParser()
    add_timeline_args(parser)
    args = parser.parse_args(["--timeline", str(tmp_path / "t.json")])
    for rank, name in ((0, "t.json"), (1, "t-rank1.json"), (3, "t-rank3.json")):
        timeline = timeline_from_args(args, torch.device("cpu"), rank=rank)
        assert isinstance(timeline, Timeline) and timeline.path == tmp_path / name
        timeline.begin_batch(0, 0)
        timeline.add_span("wait", 1.0, 2.0)
        timeline.write_json(rank=rank)
        document = read_timeline(tmp_path / name)
        assert document["meta"]["rank"] == rank and document["meta"]["origin_s"] > 0
    with pytest.raises(ConfigError, match="no path"):
        Timeline("cpu").write_json()
    assert timeline_from_args(parser.parse_args([]), torch.device("cpu"), rank=0) is None
    with pytest.raises(ConfigError, match="--trace needs --timeline"):
        timeline_from_args(parser.parse_args(["--trace", "x.json"]), torch.device("cpu"), rank=0)
