"""``distgnn-launch --local`` on stand-in programs: the plan runs, output is labelled, failures stop everything."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from launch_progs.harness import CLEANUP_S, FakeJob, assert_nothing_left
from netns_cluster import free_port

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the launcher's wrapper needs Linux /proc")


def local_job(tmp_path) -> FakeJob:
    base = free_port(span=20)
    return FakeJob(tmp_path, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])


def test_local_job_runs_the_plan(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", "--num-servers", "2"))
    assert proc.wait(timeout=120) == 0, job.stderr()
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, r in reports.items():
        assert r["label"] == f"[{rank // 2}/trainer/{rank}]"
        assert (r["machine_id"], r["local_rank"], r["world_size"]) == (rank // 2, rank % 2, 4)
        assert r["role"] == "trainer" and r["num_trainers"] == 2 and r["num_servers"] == 2
        assert r["ip_config"] == str(tmp_path / "ip.txt") and r["part_config"] == str(tmp_path / "g.json")
        assert r["cwd"] == str(tmp_path) and r["args"] == ["--epochs", "1"]
        assert r["token_sha"] and not r["token_in_argv"] and r["restart_count"] == 0
    assert len({r["token_sha"] for r in reports.values()}) == 1
    for machine in (0, 1):
        for server in (0, 1):
            assert (
                f"[{machine}/server/{server}] fake server ready machine={machine} server={server} role=server token=yes"
                in job.stdout()
            )
    assert_nothing_left(job, job.job_id())


def test_local_trainer_raising_stops_the_job(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="raise", env=("FAKE_RAISE_RANK=3", "FAKE_DELAY=1")))
    assert proc.wait(timeout=120) == 1
    err = job.stderr()
    cause = "distgnn-launch: error: trainer 3 of machine 1 (partition 1, host 127.0.0.1, pid {}) exited with code 1"
    assert (
        cause.format(job.pids()["trainer-r3"]) + "; last stderr line: RuntimeError: fake trainer 3 fails on cue" in err
    )
    assert "last" in err and "RuntimeError: fake trainer 3 fails on cue" in err.split("lines of [1/trainer/3]")[1]
    run_dir = tmp_path / "distgnn-runs" / job.job_id() / "attempt-0"
    assert f"2 servers and 1 torchrun agent were stopped; full logs in {run_dir}" in err
    assert "fails on cue" in (run_dir / "1-trainer-3.log").read_text()
    assert "fake server ready machine=1" in (run_dir / "1-server-0.log").read_text()
    assert_nothing_left(job, job.job_id())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_local_signal_stops_everything(tmp_path, sig):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="sleep"))
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig
    assert f"received {signal.Signals(sig).name}" in job.stderr()
    assert_nothing_left(job, job.job_id())


def test_local_launcher_killed_outright_leaves_nothing(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="sleep"))
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    proc.kill()  # no chance to clean up: the wrappers see their stdin close and stop their trees
    proc.wait()
    assert_nothing_left(job, job.job_id(), timeout=20)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("distgnn-launch: error:")]


@pytest.mark.parametrize("victim", ["server-m1-s0", "trainer-r2"])
def test_local_kill_9_is_named_first_and_the_job_ends_within_10_s(tmp_path, victim):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="sleep"))
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    pid = job.pids()[victim]
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    assert proc.wait(timeout=60) == 1
    took = time.monotonic() - started
    who = "server 0" if victim.startswith("server") else "trainer 2"
    (line,) = error_lines(job.stderr())
    assert (
        line
        == f"distgnn-launch: error: {who} of machine 1 (partition 1, host 127.0.0.1, pid {pid}) was killed by SIGKILL"
    )
    assert took < 10, f"{took:.1f} s from kill -9 to the launcher's exit"
    assert_nothing_left(job, job.job_id(), timeout=CLEANUP_S)


@pytest.mark.parametrize(
    "ip_config, num_parts, message",
    [
        ("127.0.0.1 {p}\n127.0.0.1 {p} extra\n", 2, r"ip.txt:2: expected 'IP \[PORT\]'"),
        ("127.0.0.1 {p}\n127.0.0.1 {q}\n", 3, "lists 2 machines but .* has 3 partitions"),
        ("127.0.0.1 {p}\n127.0.0.1 {p}\n", 2, "machines 0 and 1 are both 127.0.0.1"),
    ],
)
def test_bad_configuration_fails_before_anything_starts(tmp_path, ip_config, num_parts, message):
    import re

    job = local_job(tmp_path)
    port = free_port(span=20)
    job.write_ip_config(ip_config.format(p=port, q=port + 10))
    (tmp_path / "g.json").write_text(f'{{"num_parts": {num_parts}}}')
    proc = job.start(job.argv("--local"))
    assert proc.wait(timeout=60) == 2
    assert re.search(message, job.stderr()), job.stderr()
    assert "distgnn-launch: error:" in job.stderr()
    assert job.pids() == {} and "job j" not in job.stderr()


def test_missing_interpreter_fails_before_anything_starts(tmp_path):
    job = local_job(tmp_path)
    argv = job.argv("--local")
    missing = tmp_path / "missing" / "python3"
    argv[argv.index("--") + 1] = str(missing)
    proc = job.start(argv)
    assert proc.wait(timeout=60) == 2
    assert f"cannot run '{missing}' on this machine" in job.stderr()
    assert job.pids() == {}


def test_local_max_restarts_starts_a_failed_job_again(tmp_path):
    job = local_job(tmp_path)
    argv = job.argv("--local", "--max-restarts", "2", mode="crash_once", env=("FAKE_RAISE_RANK=1",))
    proc = job.start(argv)
    assert proc.wait(timeout=120) == 0, job.stderr()
    err = job.stderr()
    (line,) = error_lines(err)
    assert line.startswith("distgnn-launch: error: trainer 1 of machine 0 (partition 0, host 127.0.0.1, pid ")
    assert f"restarting job {job.job_id()} (1 of 2)" in err and "(2 of 2)" not in err
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3] and {r["restart_count"] for r in reports.values()} == {1}
    runs = tmp_path / "distgnn-runs" / job.job_id()
    assert "fails on cue" in (runs / "attempt-0" / "0-trainer-1.log").read_text()
    assert '"restart_count": 1' in (runs / "attempt-1" / "0-trainer-1.log").read_text()
    assert_nothing_left(job, job.job_id())


def test_local_max_restarts_gives_up(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", "--max-restarts", "1", mode="raise", env=("FAKE_RAISE_RANK=2",)))
    assert proc.wait(timeout=120) == 1
    err = job.stderr()
    assert len(error_lines(err)) == 2 and "giving up after 1 restarts" in err
    assert_nothing_left(job, job.job_id())
