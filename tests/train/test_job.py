"""distgnn.train.job: the shared flags, the local runner (trainers, failures, SIGTERM) and the trainer side."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distgnn.data.datasets import add_dataset_args
from distgnn.launch.cpus import cpu_share
from distgnn.sampling.source import InProcessGraph
from distgnn.train import job

SCRIPT = Path(__file__).resolve().parents[1] / "launch_progs" / "job_script.py"
SMALL = ["--dataset=synthetic", "--num-nodes=400", "--avg-degree=4", "--feat-dim=8", "--synthetic-classes=3"]
SMALL += ["--part-method=random", "--num-parts=2"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_dataset_args(p)
    job.add_job_args(p, epochs=3)
    return p


def test_job_flags_have_the_examples_defaults_and_local_excludes_single(capsys) -> None:
    args = parser().parse_args([])
    assert (args.num_parts, args.part_method, args.trainers_per_machine, args.servers_per_machine) == (
        2,
        "metis",
        1,
        1,
    )
    assert (args.epochs, args.prefetch, args.device, args.local, args.single) == (3, None, "cpu", False, False)
    with pytest.raises(SystemExit):
        parser().parse_args(["--local", "--single"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_torch_threads_share_out_the_cpus_this_process_may_run_on(monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host's CPUs; the affinity below is what counts
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6, 7, 8, 9})
    args = parser().parse_args([])
    assert args.num_threads == 0
    assert [job.torch_threads(args, n) for n in (1, 2, 4, 12)] == [6, 3, 1, 1]
    assert job.torch_threads(parser().parse_args(["--num-threads", "5"]), 2) == 5


def test_bind_cpus_gives_each_trainer_of_a_host_its_own_slice(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {9, 4, 5, 6, 7, 8, 10})
    shares = [cpu_share(rank, 3) for rank in range(3)]
    assert shares == [[4, 5, 6], [7, 8], [9, 10]]  # disjoint, contiguous, every CPU once
    assert cpu_share(1, 9) == [4, 5, 6, 7, 8, 9, 10]  # fewer CPUs than trainers: all of them
    with pytest.raises(job.ConfigError, match="LOCAL_RANK 3"):
        job.configure_torch(parser().parse_args(["--bind-cpus=yes"]), 3, local_rank=3)
    bound: list[tuple[int, list[int]]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: bound.append((pid, list(cpus))))
    threads = torch.get_num_threads()
    try:
        job.configure_torch(parser().parse_args(["--bind-cpus=yes"]), 3, local_rank=2)
        assert bound == [(0, [9, 10])] and torch.get_num_threads() == 2  # the threads follow the share
        job.configure_torch(parser().parse_args(["--device=cuda"]), 3, local_rank=0)  # auto: bound on a GPU
        assert bound[1:] == [(0, [4, 5, 6])] and torch.get_num_threads() == 3
        for flags in ([], ["--device=cuda", "--bind-cpus=no"]):  # auto on a CPU, or asked not to: not bound
            job.configure_torch(parser().parse_args(flags), 3, local_rank=2)
            assert len(bound) == 2 and torch.get_num_threads() == 2  # 7 CPUs / 3 trainers
    finally:
        torch.set_num_threads(threads)


def test_the_single_process_trainer_holds_the_whole_graph() -> None:
    args = parser().parse_args([*SMALL, "--single", "--no-malloc-tuning", "--quiet"])
    with job.start_trainer(args) as trainer:
        assert isinstance(trainer.g, InProcessGraph) and not trainer.distributed
        assert (trainer.rank, trainer.world_size, trainer.machine_group, trainer.show_progress) == (0, 1, None, False)
        mask = torch.as_tensor(trainer.g.ndata["train_mask"]).bool()
        assert torch.equal(trainer.seeds("train_mask"), torch.nonzero(mask).flatten())
        assert torch.equal(trainer.inference_nodes(), torch.arange(400))
        assert trainer.new_buffer(0, 5).shape == (400, 5)


def run_script(tmp_path: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(SCRIPT), *SMALL, "--local", f"--workdir={tmp_path}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_local_job_runs_every_trainer_and_splits_the_nodes_among_them(tmp_path) -> None:
    proc = run_script(tmp_path, "--trainers-per-machine=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("TRAINER"))
    assert [row[:2] for row in rows] == [["0", "4"], ["1", "4"], ["2", "4"], ["3", "4"]], proc.stdout + proc.stderr
    assert sum(int(row[3]) for row in rows) == 400  # inference covers every node once
    assert "partitioned synthetic-n400-d4-f8-c3-s0 into 2 parts" in proc.stderr
    assert len(list((tmp_path / "runs").glob("*/trainer-*.log"))) == 4


@pytest.mark.slow
def test_a_failed_trainer_stops_the_job_with_one_line_naming_it_and_max_restarts_start_it_again(tmp_path) -> None:
    proc = run_script(tmp_path, "--fail-rank=1", "--fail-times=2", "--max-restarts=1")
    assert proc.returncode == 3
    causes = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(causes) == 2, proc.stderr[-3000:]  # the first attempt and the restart
    for attempt, cause in enumerate(causes):
        assert cause.startswith("error: trainer 1 of machine 1 (partition 1, host 127.0.0.1, pid ")
        assert cause.endswith(
            f"exited with code 3; last stderr line: trainer 1 gives up on purpose in attempt {attempt}"
        )
    assert "restarting the job (1 of 1); cause: trainer 1 of machine 1" in proc.stderr
    assert "giving up after 1 restarts" in proc.stderr
    summaries = [line for line in proc.stderr.splitlines() if "full logs in" in line]
    assert len(summaries) == 2 and "2 servers and 1 trainer were stopped" in summaries[0]
    run_dir = Path(summaries[0].rsplit("full logs in ", 1)[1])
    assert "gives up on purpose in attempt 0" in (run_dir / "trainer-1.log").read_text()
    assert "gives up on purpose in attempt 1" in (run_dir / "attempt-1" / "trainer-1.log").read_text()


@pytest.mark.slow
def test_a_trainer_killed_outright_is_named_with_its_signal(tmp_path) -> None:
    proc = run_script(tmp_path, "--kill-rank=0")
    assert proc.returncode == 1
    assert (
        "error: trainer 0 of machine 0 (partition 0, host 127.0.0.1, pid " in proc.stderr
        and "was killed by SIGKILL" in proc.stderr
    )


@pytest.mark.slow
def test_sigterm_stops_the_trainers_and_the_cluster(tmp_path) -> None:
    argv = [sys.executable, str(SCRIPT), *SMALL, "--local", f"--workdir={tmp_path}", "--sleep=60"]
    runner = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joined = 0
    while joined < 2 and (line := runner.stdout.readline()):  # both trainers joined the job
        joined += line.startswith("TRAINER")
    assert joined == 2, runner.stderr.read()[-3000:]
    children = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(runner.pid)]).split()]
    assert len(children) == 4  # two servers, two trainers
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in children), children
