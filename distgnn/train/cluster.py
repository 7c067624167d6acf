"""``LocalCluster``: a whole job's servers on one host, for tests, benchmarks and examples.

Each partition becomes a simulated machine on 127.0.0.1 with its own ports;
every server is a separate ``python -m distgnn.server`` process configured
through the launcher's environment variables, exactly as ``distgnn-launch``
starts it. On exit (also after an error, a dead server, or the test runner
being killed) every process is stopped and the job's shared memory removed.
Servers are tied to the thread that started them (``PR_SET_PDEATHSIG``): start
a cluster from a thread that outlives it, normally the main thread. An owner killed
outright (SIGKILL) cannot remove its work directory; the next cluster started on
the host does (:func:`sweep_orphans`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distgnn.config import JobConfig
from distgnn.errors import DistGNNError, RpcTimeoutError
from distgnn.launch.supervisor import die_with_parent
from distgnn.partition.format import read_meta
from distgnn.rpc.client import RpcClient
from distgnn.store import shm

log = logging.getLogger(__name__)


def sweep_orphans(tmp_dir: str | Path | None = None, min_idle_s: float = 300.0) -> list[str]:
    """Removes what clusters whose owner process died without stopping them (SIGKILL) left behind: their
    work directories under ``tmp_dir`` (default: the system temp dir) and their jobs' shared memory.

    A directory counts as orphaned only when it holds an ``owner.pid`` naming a process that no longer exists
    (a live or unknown owner, or a recycled pid, leaves it alone) and nothing in it changed for ``min_idle_s``
    (an owner in another pid namespace sharing this temp dir still writes its servers' logs). Returns the job
    ids cleaned up.
    """
    cleaned = []
    now = time.time()
    for workdir in Path(tmp_dir or tempfile.gettempdir()).glob("distgnn-cluster-*"):
        try:
            pid = int((workdir / "owner.pid").read_text())
            job_id = (workdir / "job_id").read_text().strip()
            last_change = max(path.stat().st_mtime for path in [workdir, *workdir.iterdir()])
        except (OSError, ValueError):
            continue  # not one of ours, or its owner is still writing it
        if _process_exists(pid) or now - last_change < min_idle_s:
            continue
        if job_id:
            shm.remove_segments(job_id)
        shutil.rmtree(workdir, ignore_errors=True)
        cleaned.append(job_id)
        log.info("removed the files of cluster job %s, whose owner (pid %d) is gone", job_id, pid)
    return cleaned


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def free_port_block(count: int, taken: set[int]) -> int:
    """A port p such that p..p+count-1 are free now (others may still grab them: the caller retries)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        ports = range(base, base + count)
        if base + count > 65535 or taken.intersection(ports):
            continue
        try:
            for port in ports[1:]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise DistGNNError(f"found no block of {count} free consecutive ports on 127.0.0.1")


class LocalCluster:
    """Start every server of a partitioned graph on loopback.

    Args:
        part_config: the partition JSON; machine ``i`` serves partition ``i``.
        servers_per_machine: 1 main server plus backups per machine.
        job_id, token: generated when absent.
        rpc_timeout_s: deadline of every RPC of clients built from ``config``.
        curve: encrypt RPC with CURVE.
        num_trainers: trainers per machine (written into the trainers' config).
        start_timeout_s: how long all servers may take to answer ``meta``.
    """

    def __init__(
        self,
        part_config: str | os.PathLike,
        servers_per_machine: int = 1,
        job_id: str | None = None,
        token: str | None = None,
        rpc_timeout_s: float = 30.0,
        curve: bool = False,
        num_trainers: int = 1,
        start_timeout_s: float = 120.0,
    ):
        self.part_config = Path(part_config).resolve()
        self.num_machines = read_meta(self.part_config).num_parts
        self.servers_per_machine = servers_per_machine
        self.rpc_timeout_s = rpc_timeout_s
        self.curve = curve
        self.num_trainers = num_trainers
        self.start_timeout_s = start_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="distgnn-cluster-"))
        self.ip_config = self.workdir / "ip_config.txt"
        self._job_id = job_id
        self._token = token
        self._base: JobConfig | None = None
        self.processes: dict[tuple[int, int], subprocess.Popen] = {}
        self._logs: dict[tuple[int, int], Path] = {}
        self._stopped = False
        self._owner_pid = os.getpid()

    # -- configuration handed to trainers ------------------------------------------------------

    @property
    def job_id(self) -> str:
        return self._config_base().job_id

    def _config_base(self) -> JobConfig:
        if self._base is None:
            raise DistGNNError("LocalCluster is not started; use it as a context manager or call start()")
        return self._base

    def config(self, machine_id: int = 0, **overrides) -> JobConfig:
        """A trainer's config on machine ``machine_id`` (``overrides`` replace fields)."""
        return self._config_base().with_(role="trainer", machine_id=machine_id, server_id=0, **overrides)

    def trainer_env(self, machine_id: int = 0, **overrides) -> dict[str, str]:
        """Environment variables that make ``distgnn.initialize()`` join this cluster as a trainer."""
        return self.config(machine_id, **overrides).to_env()

    def process(self, machine_id: int, server_id: int = 0) -> subprocess.Popen:
        return self.processes[(machine_id, server_id)]

    def server_log_path(self, machine_id: int, server_id: int = 0) -> Path:
        """The file a server's stdout and stderr go to (removed when the cluster stops)."""
        return self._logs[(machine_id, server_id)]

    def server_log(self, machine_id: int, server_id: int = 0) -> str:
        """The tail of a server's stdout and stderr."""
        try:
            return self._logs[(machine_id, server_id)].read_text(errors="replace")[-4000:]
        except (KeyError, OSError):
            return ""

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        atexit.register(self.stop)
        sweep_orphans(self.workdir.parent)
        try:
            for attempt in range(3):
                self._write_ip_config()
                self._spawn_servers()
                try:
                    self._wait_ready()
                    return self
                except _PortTaken:
                    log.info("a port was taken while starting (attempt %d); retrying on other ports", attempt + 1)
                    self._stop_processes()
            raise DistGNNError("could not start the cluster: ports kept being taken by other processes")
        except BaseException:
            self.stop()
            raise

    def _write_ip_config(self) -> None:
        taken: set[int] = set()
        lines = []
        for _ in range(self.num_machines):
            base = free_port_block(self.servers_per_machine, taken)
            taken.update(range(base, base + self.servers_per_machine))
            lines.append(f"127.0.0.1 {base}")
        self.ip_config.write_text("\n".join(lines) + "\n")
        (self.workdir / "owner.pid").write_text(str(self._owner_pid))
        self._base = JobConfig.create(
            self.ip_config,
            self.part_config,
            job_id=self._base.job_id if self._base else self._job_id,
            token=self._base.token if self._base else self._token,
            num_servers=self.servers_per_machine,
            num_trainers=self.num_trainers,
            curve=self.curve,
            rpc_timeout_s=self.rpc_timeout_s,
        )
        (self.workdir / "job_id").write_text(self._base.job_id)  # for sweep_orphans, with owner.pid

    def _spawn_servers(self) -> None:
        base = self._config_base()
        for machine_id in range(self.num_machines):
            for server_id in range(self.servers_per_machine):
                cfg = base.with_(role="server", machine_id=machine_id, server_id=server_id)
                log_path = self.workdir / f"server-m{machine_id}-s{server_id}.log"
                with open(log_path, "wb") as out:
                    self.processes[(machine_id, server_id)] = subprocess.Popen(
                        [sys.executable, "-m", "distgnn.server"],
                        env={**os.environ, **cfg.to_env()},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                self._logs[(machine_id, server_id)] = log_path

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with RpcClient(self.config(0)) as client:
            for key in self.processes:
                while True:
                    proc = self.processes[key]
                    if proc.poll() is not None:
                        tail = self.server_log(*key)
                        if "Address already in use" in tail:
                            raise _PortTaken
                        raise DistGNNError(
                            f"{client.describe(*key)} exited with code {proc.returncode} while starting; "
                            f"its log ends:\n{tail}"
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RpcTimeoutError(
                            f"{client.describe(*key)} did not answer 'meta' within {self.start_timeout_s}s; "
                            f"its log ends:\n{self.server_log(*key)}"
                        )
                    try:
                        client.call(key[0], "meta", server_id=key[1], timeout_s=min(0.25, remaining))
                        break
                    except RpcTimeoutError:
                        continue

    def stop(self) -> None:
        """Stop every server (shutdown op, then SIGTERM, then SIGKILL) and remove the job's files."""
        if self._stopped or os.getpid() != self._owner_pid:
            return  # already stopped, or a forked child exiting: the servers belong to the parent
        self._stopped = True
        atexit.unregister(self.stop)
        try:
            self._stop_processes()
        finally:
            if self._base is not None:
                shm.remove_segments(self._base.job_id)
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_processes(self) -> None:
        alive = {key: p for key, p in self.processes.items() if p.poll() is None}
        if alive and self._base is not None:
            with contextlib.suppress(Exception), RpcClient(self.config(0), timeout_s=2.0) as client:
                rids = [client.send(m, "shutdown", server_id=s) for (m, s) in alive]
                client.wait(rids)
        for sig, grace in ((None, 5.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = {key: p for key, p in alive.items() if p.poll() is None}
            if not alive:
                break
            for p in alive.values():
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(sig)
            deadline = time.monotonic() + grace
            for p in alive.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.0, deadline - time.monotonic()))
        self.processes.clear()


class _PortTaken(Exception):
    """A server could not bind its port: another process took it after we checked."""
