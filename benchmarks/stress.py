"""Runs every multi-process job kind over and over under competing CPU load and counts failures by kind.
Prints a table.

    python benchmarks/stress.py --runs 30                      # every kind 30 times, 2 busy processes per core
    python benchmarks/stress.py --runs 5 --kinds tgn-memory2 launch-tgn --log-dir /tmp/stress
    python benchmarks/stress.py --runs 2 --first-run 8                         # runs 8 and 9 of a count in chunks

Kinds (each a small job of a few seconds of training, 2 machines x 1 trainer, CPU, one thread per trainer):

* ``--local`` jobs: ``static`` (GraphSAGE), ``typed`` (R-GCN), ``link`` (link prediction), ``tgn-memory2`` and
  ``tgn-epoch2`` (TGN, memory / epoch parallelism 2), ``snapshot-blad``, ``snapshot-contiguous``,
  ``snapshot-vertex``;
* through ``distgnn-launch --local`` with an ip_config of two machines on this host: ``launch-static``
  (GraphSAGE with graph servers), ``launch-tgn``, ``launch-snapshot`` (no servers);
* ``signal-static``, ``signal-tgn``, ``signal-snapshot``: a ``--local`` job sent SIGINT (even runs) or SIGTERM
  (odd runs) once rank 0 ends its first epoch; it must exit with 128 + the signal within 10 s.

A run passes when it exits as expected (0 and a ``RESULT`` line; 128 + the signal), leaves no process of its process
group and no /dev/shm segment of its job. The load is ``--load-per-core`` busy processes per core, started before
the first run and stopped after the last; Ctrl-C or SIGTERM stops the load and the job running. Kinds take turns, so
a change in the machine's other load spreads over all of them. ``--log-dir`` keeps each failed run's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from restart_dynamic import JOBS, local_job  # noqa: E402

EXAMPLES = ROOT / "examples"
GRAPH = ["--dataset=synthetic", "--num-nodes=3000", "--avg-degree=10", "--feat-dim=16"]
STATIC = [str(EXAMPLES / "graphsage" / "train_dist.py"), *GRAPH, "--synthetic-classes=4", "--batch-size=64"]
STATIC += ["--hidden=32", "--fanouts=5,5", "--quiet", "--num-parts=2", "--part-method=random", "--num-threads=1"]
TYPED = [str(EXAMPLES / "rgcn" / "train_dist.py"), "--dataset=synthetic-mag", "--num-papers=3000", "--feat-dim=16"]
TYPED += ["--synthetic-classes=4", "--batch-size=256", "--hidden=32", "--fanouts=5,5", "--quiet", "--num-parts=2"]
TYPED += ["--num-threads=1", "--epochs=2"]
LINK = [str(EXAMPLES / "link_prediction" / "train_dist.py"), "--dataset=synthetic", "--num-nodes=1500"]
LINK += ["--avg-degree=6", "--feat-dim=16", "--synthetic-classes=16", "--batch-size=256", "--hidden=32"]
LINK += ["--fanouts=5,5", "--eval-negatives=20", "--predictor=mlp", "--quiet", "--num-parts=2", "--num-threads=1"]
LINK += ["--epochs=2"]


def dynamic(name: str, *extra: str) -> list[str]:
    return [*JOBS[name].command(None)[1:], *extra]


LOCAL = {
    "static": [*STATIC, "--epochs=2"],
    "typed": TYPED,
    "link": LINK,
    "tgn-memory2": dynamic("tgn-memory2", "--epochs", "2"),
    "tgn-epoch2": dynamic("tgn-epoch2", "--epochs", "1"),
    **{f"snapshot-{s}": dynamic(f"snapshot-{s}", "--epochs", "10") for s in ("blad", "contiguous", "vertex")},
}
LAUNCHED = {
    "launch-static": [*STATIC, "--epochs=2"],
    "launch-tgn": dynamic("tgn-memory2", "--epochs", "2"),
    "launch-snapshot": dynamic("snapshot-contiguous", "--epochs", "10"),
}
SIGNALLED = {
    "signal-static": [*STATIC, "--epochs=1000"],
    "signal-tgn": dynamic("tgn-memory2", "--epochs", "1000", "--no-eval"),
    "signal-snapshot": dynamic("snapshot-contiguous", "--epochs", "100000", "--no-eval"),
}
KINDS = [*LOCAL, *LAUNCHED, *SIGNALLED]
STOP_WITHIN_S = 10.0
RUN_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    """One run: whether it passed, its wall seconds, what went wrong, its output."""

    ok: bool
    seconds: float
    problem: str = ""
    output: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]


def default_sigint() -> None:
    """In the child before it runs the job: Ctrl-C's default action, which Python turns into KeyboardInterrupt
    (a shell starts a background command with SIGINT ignored, and its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies left out)."""
    members = []
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        try:  # a process that exits meanwhile (ENOENT, ESRCH) is left out
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(pid))
    return members


def job_ids_of(pids: list[int]) -> set[str]:
    found = set()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found.update(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"DISTGNN_JOB_ID="))
    return found


class Watched:
    """A job in its own process group, its output collected, the job ids its processes carry noted."""

    live: set[Watched] = set()  # started and not yet stopped: what the harness stops when it is interrupted

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
        self.lines: list[str] = []
        self.first_epoch = threading.Event()
        self.job_ids: set[str] = set()
        Watched.live.add(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("epoch") or "] epoch" in line:
                self.first_epoch.set()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.job_ids |= job_ids_of(group_members(self.proc.pid))
            time.sleep(0.5)

    def output(self) -> str:
        self._reader.join(timeout=5)
        return "".join(self.lines)

    def leftovers(self) -> str:
        """What the job left: live processes of its group, /dev/shm segments of its jobs ('' when nothing)."""
        deadline = time.monotonic() + 10
        while True:
            procs = group_members(self.proc.pid)
            segments = sorted(p.name for j in self.job_ids for p in Path("/dev/shm").glob(f"distgnn-{j}-*"))
            if not (procs or segments) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if procs:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return (f"processes {procs} " if procs else "") + (f"/dev/shm {segments}" if segments else "")

    def stop(self) -> None:
        """Kills what is left of the job (after a failure) and removes its segments, which its parent, killed
        too, cannot."""
        Watched.live.discard(self)
        if self.proc.poll() is None or group_members(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for job_id in self.job_ids:
                for segment in Path("/dev/shm").glob(f"distgnn-{job_id}-*"):
                    segment.unlink(missing_ok=True)


def finished(job: Watched, began: float, timeout: float) -> Outcome:
    """The outcome of a job that should end by itself with exit 0 and a RESULT line."""
    try:
        code = job.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.stop()
        return Outcome(False, time.monotonic() - began, f"no end within {timeout:.0f} s", job.output())
    seconds = time.monotonic() - began
    out = job.output()
    left = job.leftovers()
    job.stop()  # what a failed run left, after it was counted
    if code != 0:
        last = [line for line in out.splitlines() if line.strip()][-1:] or [""]
        return Outcome(False, seconds, f"exit {code}: {last[0][:160]}", out)
    if "RESULT " not in out:
        return Outcome(False, seconds, "no RESULT line", out)
    if left:
        return Outcome(False, seconds, f"left {left}", out)
    return Outcome(True, seconds, output=out)


def run_local(kind: str, workdir: Path) -> Outcome:
    began = time.monotonic()
    job = Watched([sys.executable, *LOCAL[kind], "--local", "--workdir", str(workdir)], workdir)
    return finished(job, began, RUN_TIMEOUT_S)


def partition_static(workdir: Path) -> Path:
    """The synthetic graph of the static kinds, partitioned 2 ways for distgnn-launch; returns its JSON."""
    out = workdir / "synthetic2"
    if not out.exists():
        cmd = [sys.executable, "-m", "distgnn.partition.cli", *GRAPH, "--num-classes=4", "--num-parts=2"]
        subprocess.run([*cmd, "--method=random", "--out", str(out)], check=True, capture_output=True, timeout=300)
    return next(out.glob("*.json"))


def run_launched(kind: str, workdir: Path, run: int) -> Outcome:
    workspace = workdir / f"run{run}"
    workspace.mkdir()
    job_files = local_job(workspace)
    argv = [sys.executable, "-m", "distgnn.launch.cli", "--ip-config", "ip.txt", "--num-trainers", "1", "--local"]
    argv += ["--workspace", str(workspace)]
    if kind == "launch-static":
        argv += ["--num-servers", "1", "--part-config", str(partition_static(workdir))]
    else:
        argv += ["--num-servers", "0"]
    began = time.monotonic()
    job = Watched([*argv, "--", sys.executable, *LAUNCHED[kind]], workspace)
    outcome = finished(job, began, RUN_TIMEOUT_S)
    del job_files
    return outcome


def run_signalled(kind: str, workdir: Path, run: int) -> Outcome:
    sig = signal.SIGINT if run % 2 == 0 else signal.SIGTERM
    began = time.monotonic()
    job = Watched([sys.executable, *SIGNALLED[kind], "--local", "--workdir", str(workdir)], workdir)
    try:
        if not job.first_epoch.wait(RUN_TIMEOUT_S) or job.proc.poll() is not None:
            return Outcome(False, time.monotonic() - began, f"no first epoch (exit {job.proc.poll()})", job.output())
        job.job_ids |= job_ids_of(group_members(job.proc.pid))
        os.kill(job.proc.pid, sig)
        sent = time.monotonic()
        try:
            code = job.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return Outcome(False, time.monotonic() - began, f"{sig.name}: no exit within 60 s", job.output())
        took = time.monotonic() - sent
        out, left = job.output(), job.leftovers()
        if code != 128 + sig:
            return Outcome(False, took, f"{sig.name}: exit {code}, expected {128 + sig}", out)
        if took > STOP_WITHIN_S:
            return Outcome(False, took, f"{sig.name}: stopped after {took:.1f} s", out)
        if left:
            return Outcome(False, took, f"{sig.name}: left {left}", out)
        return Outcome(True, took, output=out)  # the seconds from the signal to the exit
    finally:
        job.stop()


def start_load(per_core: int) -> list[subprocess.Popen]:
    spin = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(per_core * (os.cpu_count() or 1))]


def stop_load(load: list[subprocess.Popen]) -> None:
    for proc in load:
        proc.kill()
    for proc in load:
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind")
    parser.add_argument(
        "--first-run",
        type=int,
        default=0,
        help="number of the first run, to continue a count in chunks (even runs of a signal kind send SIGINT, odd SIGTERM)",
    )
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    parser.add_argument("--load-per-core", type=int, default=2, help="busy processes per core beside the jobs")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each failed run's output here")
    args = parser.parse_args()
    tallies = {kind: Tally() for kind in args.kinds}
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the cleanup below runs
    load = start_load(args.load_per_core)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
            tmp = Path(tmp)
            for run in range(args.first_run, args.first_run + args.runs):
                for kind in args.kinds:
                    workdir = tmp / kind
                    workdir.mkdir(exist_ok=True)
                    if kind in LOCAL:
                        outcome = run_local(kind, workdir)
                    elif kind in LAUNCHED:
                        outcome = run_launched(kind, workdir, run)
                    else:
                        outcome = run_signalled(kind, workdir, run)
                    tallies[kind].outcomes.append(outcome)
                    status = "ok" if outcome.ok else f"FAILED: {outcome.problem}"
                    print(f"run {run} {kind}: {outcome.seconds:.1f} s {status}", file=sys.stderr, flush=True)
                    if not outcome.ok and args.log_dir:
                        args.log_dir.mkdir(parents=True, exist_ok=True)
                        (args.log_dir / f"{kind}-{run}.log").write_text(outcome.output)
    finally:
        for job in list(Watched.live):  # a job in its own process group outlives an interrupted harness
            job.stop()
        stop_load(load)
    cores = os.cpu_count()
    print(
        f"{args.runs} runs of each kind, {args.load_per_core * cores} busy processes on {cores} cores beside them, "
        f"{time.monotonic() - started:.0f} s; seconds: a run's wall time (signal kinds: from the signal to the exit)"
    )
    print("| kind | runs | failures | median s | max s | first failure |")
    print("|---|---|---|---|---|---|")
    for kind, tally in tallies.items():
        secs = [o.seconds for o in tally.outcomes]
        failed = tally.failures()
        first = failed[0].problem.replace("|", "/") if failed else ""
        print(f"| {kind} | {len(secs)} | {len(failed)} | {statistics.median(secs):.1f} | {max(secs):.1f} | {first} |")
    print(json.dumps({kind: len(t.failures()) for kind, t in tallies.items()}))


if __name__ == "__main__":
    main()
