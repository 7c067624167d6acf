"""The event graph in shared memory: one copy per machine that its trainers map, equal to the CSR built in
process (the sampler gives the same picks on it), clear errors for a missing or corrupt segment or a dead
builder, and nothing left in /dev/shm after a job, also one whose trainer failed."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from distgnn.data.events import synthetic_events
from distgnn.errors import SharedMemoryError
from distgnn.nn.temporal import TGN
from distgnn.store import shm
from distgnn.temporal import build_temporal_csr, shared
from distgnn.temporal.sampler import TemporalSampler
from distgnn.temporal.train import TGNRunner, train_epoch
from distgnn.train.job import run_local

KEY = "synthetic-events:300:5000 seed=3"


def stream():
    return synthetic_events(300, 5000, seed=3, feat_dim=4)


@pytest.fixture
def slot():
    slot = shared.MachineSlot(f"t{secrets.token_hex(4)}", 0)
    yield slot
    shm.remove_segments(slot.job_id)


def mapped_segments(pid_maps: str, slot: shared.MachineSlot) -> dict[str, int]:
    """Segment name -> inode of every ``temporal.*`` segment of ``slot`` in a /proc/PID/maps text."""
    found = {}
    prefix = str(shm.segment_path(slot.job_id, slot.machine, "temporal."))
    for line in pid_maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith(prefix):
            found[fields[5].removeprefix(prefix)] = int(fields[4])
    return found


def _trainer(slot: shared.MachineSlot, load_log: str, out: multiprocessing.Queue) -> None:
    def load():
        with open(load_log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return stream()

    graph = shared.machine_event_graph(slot, KEY, load, wait_s=60)
    assert not graph.events.src.flags.writeable and not graph.csr.neighbors.flags.writeable
    with open("/proc/self/maps") as f:
        maps = mapped_segments(f.read(), slot)
    out.put((graph.built, maps, int(graph.csr.eids.sum()), float(graph.events.time.sum())))


def test_trainers_of_a_machine_map_one_copy(slot, tmp_path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_trainer, args=(slot, str(tmp_path / "loads"), out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert len((tmp_path / "loads").read_text().split()) == 1  # the stream was read once
    assert sorted(r[0] for r in results) == [False, False, True]  # one builder, two trainers mapped its copy
    maps = [r[1] for r in results]
    names = {"src", "dst", "time", "feat", "csr_indptr", "csr_neighbors", "csr_times", "csr_eids"}
    assert names <= set(maps[0])
    assert maps[0] == maps[1] == maps[2]  # the same files (inodes) behind every trainer's arrays
    assert len({r[2:] for r in results}) == 1
    # One copy on the machine: exactly the group's segments, no second set.
    listed = {p.name.split("-p0-", 1)[1] for p in shm.job_segments(slot.job_id, 0)}
    assert listed == {f"temporal.{n}" for n in names} | {"temporal.manifest", "temporal.claim"}


def test_mapped_graph_equals_the_built_one_and_samples_the_same(slot):
    events = stream()
    expected = build_temporal_csr(events)
    graph = shared.machine_event_graph(slot, KEY, stream)
    assert graph.built
    again = shared.machine_event_graph(slot, KEY, lambda: pytest.fail("a second build"))
    assert not again.built
    for name in ("indptr", "neighbors", "times", "eids"):
        np.testing.assert_array_equal(getattr(again.csr, name), getattr(expected, name))
    for name in ("src", "dst", "time", "feat"):
        np.testing.assert_array_equal(getattr(again.events, name), getattr(events, name))
    assert again.events.label is None and again.events.num_nodes == events.num_nodes

    rng = np.random.default_rng(0)
    roots = torch.from_numpy(rng.integers(0, events.num_nodes, 500))
    times = torch.from_numpy(rng.uniform(0, events.time[-1], 500))
    for strategy in ("recent", "uniform"):
        mine = TemporalSampler(expected, 5, hops=2, strategy=strategy, seed=7).sample(roots, times)
        theirs = TemporalSampler(again.csr, 5, hops=2, strategy=strategy, seed=7).sample(roots, times)
        for a, b in zip(mine, theirs, strict=True):
            for field in ("neighbors", "times", "eids", "mask"):
                torch.testing.assert_close(getattr(b, field), getattr(a, field), rtol=0, atol=0)

    # A runner trains over the read-only arrays without copying them or warning about them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = TGNRunner(TGN(events.num_nodes, 4, 8, 4, 8), again.events, again.csr, torch.device("cpu"), 4)
    assert np.shares_memory(runner.src.numpy(), again.events.src)
    loss, _ = train_epoch(runner, [(0, 200), (200, 400)], torch.optim.Adam(runner.model.parameters()))
    assert np.isfinite(loss)


def test_missing_or_corrupt_segments_and_a_dead_builder_are_clear_errors(slot, tmp_path):
    shared.machine_event_graph(slot, KEY, stream)
    with pytest.raises(SharedMemoryError, match="give every trainer the same --dataset"):
        shared.machine_event_graph(slot, "events:/other.csv seed=0", stream, wait_s=1)

    path = shm.segment_path(slot.job_id, 0, "temporal.csr_neighbors")
    neighbors = np.load(path, mmap_mode="r+")
    neighbors[3] = 10**6
    neighbors.flush()
    del neighbors
    with pytest.raises(SharedMemoryError, match="is corrupt: a neighbour is outside"):
        shared.attach(slot)
    with open(path, "r+b") as f:
        f.truncate(200)
    with pytest.raises(SharedMemoryError, match=r"csr_neighbors is not a readable \.npy segment"):
        shared.attach(slot)
    path.unlink()
    with pytest.raises(SharedMemoryError, match="csr_neighbors is missing, though .*temporal.manifest lists it"):
        shared.attach(slot)

    # A builder that died before publishing: the waiting trainers say so instead of waiting.
    other = shared.MachineSlot(slot.job_id, 1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shm.segment_path(other.job_id, 1, "temporal.claim").write_text(str(dead.pid))
    with pytest.raises(SharedMemoryError, match=f"trainer pid {dead.pid}, which was building .* exited"):
        shared.machine_event_graph(other, KEY, stream, wait_s=30)
    # A live builder that does not publish in time.
    shm.segment_path(other.job_id, 1, "temporal.claim").write_text(str(os.getpid()))
    with pytest.raises(SharedMemoryError, match="has not published"):
        shared.machine_event_graph(other, KEY, stream, wait_s=0.2)


FAKE_TRAINER = """
import json, os, sys, time
from pathlib import Path
from distgnn.data.events import synthetic_events
from distgnn.temporal import shared
slot = shared.MachineSlot.from_env(os.environ)
graph = shared.machine_event_graph(slot, "k", lambda: synthetic_events(100, 2000, seed=1), wait_s=60)
with open("/proc/self/maps") as f:
    inodes = sorted({line.split()[4] for line in f if "-temporal." in line})
print("TRAINER " + json.dumps([slot.job_id, slot.machine, graph.built, inodes]), flush=True)
if "--fail" in sys.argv:
    marks = Path(sys.argv[sys.argv.index("--fail") + 1])
    (marks / os.environ["RANK"]).touch()
    if int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("the last trainer fails once every trainer mapped the event graph")
"""


def test_local_job_shares_per_machine_and_leaves_no_segment_after_a_failure(tmp_path, capfd):
    script = tmp_path / "trainer.py"
    script.write_text(FAKE_TRAINER)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = argparse.Namespace(num_parts=2, trainers_per_machine=2, num_threads=1, workdir=str(tmp_path), max_restarts=0)
    assert run_local(script, ["--fail", str(marks)], args, None) != 0
    (log,) = tmp_path.glob("runs/*/trainer-3.log")
    assert "the last trainer fails once every trainer mapped" in log.read_text()
    lines = [json.loads(x.split(" ", 1)[1]) for x in capfd.readouterr().out.splitlines() if x.startswith("TRAINER ")]
    assert len(lines) == 4
    assert shm.job_segments(lines[0][0]) == []  # swept after the failure
    per_machine = [[line for line in lines if line[1] == m] for m in (0, 1)]
    for mine in per_machine:
        assert sorted(line[2] for line in mine) == [False, True]  # one built, the other mapped its copy
        assert mine[0][3] == mine[1][3] and mine[0][3]  # the same files
    assert not set(per_machine[0][0][3]) & set(per_machine[1][0][3])  # a copy per machine


def test_local_job_leaves_no_segment_when_it_ends_well(tmp_path, capfd):
    script = tmp_path / "trainer.py"
    script.write_text(FAKE_TRAINER)
    args = argparse.Namespace(num_parts=1, trainers_per_machine=1, num_threads=1, workdir=str(tmp_path), max_restarts=0)
    assert run_local(script, [], args, None) == 0
    (line,) = [json.loads(x.split(" ", 1)[1]) for x in capfd.readouterr().out.splitlines() if x.startswith("TRAINER ")]
    assert line[2] and line[3]  # it built and mapped the graph
    assert shm.job_segments(line[0]) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mapped_graph_on_a_gpu_samples_and_trains_as_the_built_one(slot):
    events = stream()
    graph = shared.machine_event_graph(slot, KEY, stream)
    rng = np.random.default_rng(1)
    roots = torch.from_numpy(rng.integers(0, events.num_nodes, 500))
    times = torch.from_numpy(rng.uniform(0, events.time[-1], 500))
    gpu = TemporalSampler(graph.csr, 5, hops=2, device="cuda").sample(roots, times)
    cpu = TemporalSampler(build_temporal_csr(events), 5, hops=2).sample(roots, times)
    for a, b in zip(cpu, gpu, strict=True):
        for field in ("neighbors", "times", "eids", "mask"):
            torch.testing.assert_close(getattr(b, field).cpu(), getattr(a, field), rtol=0, atol=0)
    runner = TGNRunner(TGN(events.num_nodes, 4, 8, 4, 8).cuda(), graph.events, graph.csr, torch.device("cuda"), 4)
    loss, _ = train_epoch(runner, [(0, 200), (200, 400)], torch.optim.Adam(runner.model.parameters()))
    assert np.isfinite(loss) and runner.src.is_cuda
