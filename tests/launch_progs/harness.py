"""Drives ``distgnn-launch`` on the fake programs and checks that a job left nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from distgnn.launch import remote

PROGS = Path(__file__).resolve().parent
FAKE_SERVER = PROGS / "fake_server.py"
FAKE_TRAINER = PROGS / "fake_trainer.py"
JOB_LINE = re.compile(r"distgnn-launch: job (j[0-9a-f]+):")
# The launcher's last cleanup re-kills the job's processes for up to this long: a check that nothing of a job is
# left right after the launcher exits gives the processes it killed that long to be gone.
CLEANUP_S = remote.SWEEP_ROUNDS * remote.SWEEP_INTERVAL_S


class FakeJob:
    """A workspace with an ip_config, a partition JSON naming ``num_parts`` and a directory for pids."""

    def __init__(self, workspace: Path, addresses: list[str], num_parts: int | None = None, ports=None) -> None:
        self.workspace = workspace
        self.fake_dir = workspace / "fake"
        self.fake_dir.mkdir(parents=True, exist_ok=True)
        ports = ports or [None] * len(addresses)
        lines = [f"{a} {p}" if p else a for a, p in zip(addresses, ports, strict=True)]
        self.write_ip_config("\n".join(["# test cluster", *lines]) + "\n")
        (workspace / "g.json").write_text(json.dumps({"num_parts": num_parts or len(addresses)}))
        self.stdout_path = workspace / "launcher.out"
        self.stderr_path = workspace / "launcher.err"

    def write_ip_config(self, text: str) -> None:
        (self.workspace / "ip.txt").write_text(text)

    def argv(
        self, *flags: str, num_trainers: int = 2, mode: str = "ok", env: tuple[str, ...] = (), servers: bool = True
    ) -> list[str]:
        """The launcher's command line; ``servers=False``: ``--num-servers 0``, no partition, no server command."""
        with_servers = ["--part-config", "g.json", "--server-command", f"{sys.executable} {FAKE_SERVER}"]
        return [
            sys.executable,
            "-m",
            "distgnn.launch.cli",
            "--ip-config",
            "ip.txt",
            *(with_servers if servers else ["--num-servers", "0"]),
            "--num-trainers",
            str(num_trainers),
            "--workspace",
            str(self.workspace),
            "--extra-env",
            f"FAKE_DIR={self.fake_dir}",
            f"FAKE_MODE={mode}",
            *env,
            *flags,
            "--",
            sys.executable,
            str(FAKE_TRAINER),
            "--epochs",
            "1",
        ]

    def start(self, argv: list[str], prefix: list[str] = ()) -> subprocess.Popen:
        """Start the launcher with output to files (read them with ``stdout()``/``stderr()``)."""
        return subprocess.Popen(
            [*prefix, *argv],
            cwd=self.workspace,
            stdin=subprocess.DEVNULL,
            stdout=open(self.stdout_path, "wb"),  # noqa: SIM115 - the child owns it
            stderr=open(self.stderr_path, "wb"),  # noqa: SIM115
        )

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def job_id(self) -> str:
        match = JOB_LINE.search(self.stderr())
        assert match, f"the launcher printed no job line:\n{self.stderr()}"
        return match.group(1)

    def trainer_reports(self) -> dict[int, dict]:
        reports = {}
        for line in self.stdout().splitlines():
            if "FAKE_TRAINER " in line:
                label, _, payload = line.partition(" FAKE_TRAINER ")
                report = json.loads(payload)
                report["label"] = label
                reports[report["rank"]] = report
        return reports

    def pids(self) -> dict[str, int]:
        return {p.stem: int(p.read_text()) for p in self.fake_dir.glob("*.pid") if p.read_text()}

    def wait_running(self, num_servers: int, num_trainers: int, proc: subprocess.Popen, timeout: float = 60) -> None:
        """Until every fake process has started (and the trainers sleep or wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            servers = sum(1 for name in pids if name.startswith("server"))
            trainers = sum(1 for name in pids if name.startswith("trainer"))
            if (
                servers == num_servers
                and trainers == num_trainers
                and self.stdout().count("fake trainer running") >= (num_trainers - 1)
            ):
                return
            assert proc.poll() is None, f"launcher exited early ({proc.returncode}):\n{self.stderr()}"
            time.sleep(0.1)
        raise AssertionError(f"job did not start within {timeout} s:\n{self.stdout()}\n{self.stderr()}")


def job_pids(job_id: str) -> list[int]:
    """Processes on this machine whose environment carries the job id."""
    entry = f"DISTGNN_JOB_ID={job_id}".encode()
    found = []
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        try:  # a process that exits meanwhile (ENOENT, ESRCH) is left out
            if entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_nothing_left(job: FakeJob, job_id: str, timeout: float = 10) -> None:
    """No process of the job, no /dev/shm file, no torchrun log directory is left."""
    deadline = time.monotonic() + timeout
    while True:
        live = [name for name, pid in job.pids().items() if alive(pid)]
        tagged = [pid for pid in job_pids(job_id) if alive(pid)]
        shm = sorted(p.name for p in Path("/dev/shm").glob(f"distgnn-{job_id}-*"))
        tmp = sorted(p.name for p in Path("/tmp").glob(f"distgnn-{job_id}-*"))
        if not (live or tagged or shm or tmp):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: processes {live} {tagged}, /dev/shm {shm}, /tmp {tmp}")
        time.sleep(0.1)


def trainer_pid(job_id: str, rank: int, script: Path) -> int | None:
    """The pid of trainer ``rank`` of job ``job_id`` (the torchrun worker running ``script``), if it runs."""
    for pid in job_pids(job_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        if env.get("RANK") == str(rank) and "LOCAL_RANK" in env and str(script).encode() in cmdline:
            return pid
    return None
