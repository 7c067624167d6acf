"""A cluster of real hosts on this machine: network namespaces with sshd, for launcher tests.

``NetnsCluster(n)`` builds, entirely inside namespaces it creates (the host's own
network namespace is never touched):

* a "switch" namespace holding a bridge, and n host namespaces, each with one
  veth link to the bridge, address ``10.213.0.(10+i)/24`` on ``eth0`` and
  loopback up;
* ``sshd`` in every host namespace on port 22, with a generated host key, root
  login by a generated client key only; a known_hosts file with the real host
  keys, so the launcher's host-key checking is exercised for real.

All namespaces share the filesystem, process table and ``/dev/shm`` with this
machine, so partitions, the venv and shared-memory checks work unchanged.
Needs root, ``ip`` and ``sshd``; ``pytest_fixture`` skips with the reason
otherwise. ``close()`` kills every process in the namespaces and deletes them;
namespaces of dead test runs are removed when the next one starts.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SUBNET = "10.213.0"
#: An address in the cluster's subnet that no host has: connecting to it fails.
UNUSED_ADDRESS = f"{SUBNET}.99"
NAME_PREFIX = "dgnt"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable_reason() -> str | None:
    """Why the cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed (scripts/ci_system_deps.sh installs it)"
    if not os.path.exists(SSHD) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "openssh-server/openssh-client are not installed (scripts/ci_system_deps.sh installs them)"
    probe = f"{NAME_PREFIX}{os.getpid()}probe"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    entered = subprocess.run(["ip", "netns", "exec", probe, "true"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    if entered.returncode != 0:
        return f"cannot enter a network namespace: {entered.stderr.strip()}"
    return None


def remove_stale_namespaces() -> None:
    """Delete namespaces left by test runs whose process is gone (a killed pytest)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NAME_PREFIX):
            continue
        digits = "".join(c for c in name[len(NAME_PREFIX) :] if c.isdigit() or c == "x").split("x")[0]
        if digits.isdigit() and not Path(f"/proc/{digits}").exists():
            _kill_namespace_processes(name)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _namespace_pids(name: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()]


def _kill_namespace_processes(name: str) -> None:
    for _ in range(50):
        pids = _namespace_pids(name)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class NetnsCluster:
    """``num_hosts`` hosts reachable over ssh from inside any of them (see the module docstring)."""

    def __init__(self, num_hosts: int = 2) -> None:
        self.tag = f"{NAME_PREFIX}{os.getpid()}x{id(self) % 10000}"
        self.switch = f"{self.tag}s"
        self.hosts = [f"{self.tag}h{i}" for i in range(num_hosts)]
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(num_hosts)]
        self.dir = Path(tempfile.mkdtemp(prefix="distgnn-netns-"))
        self.sshd: list[subprocess.Popen] = []
        self.created: list[str] = []
        try:
            self._build_network()
            self._start_sshd()
        except BaseException:
            self.close()
            raise

    # -- building ---------------------------------------------------------------------------

    def _build_network(self) -> None:
        for name in [self.switch, *self.hosts]:
            _ip("netns", "add", name)
            self.created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (host, address) in enumerate(zip(self.hosts, self.addresses, strict=True)):
            # Both ends are created inside our namespaces: nothing appears in the host's namespace.
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", host)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", host, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")

    def _keygen(self, path: Path) -> str:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "distgnn-test", "-f", str(path)],
            check=True,
            capture_output=True,
        )
        return path.with_suffix(".pub").read_text().strip()

    def _start_sshd(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        self.client_key = self.dir / "id_client"
        (self.dir / "authorized_keys").write_text(self._keygen(self.client_key) + "\n")
        known = []
        for host, address in zip(self.hosts, self.addresses, strict=True):
            host_key = self.dir / f"host_{host}"
            public = self._keygen(host_key)
            known.append(f"{address} {' '.join(public.split()[:2])}")
            config = self.dir / f"sshd_{host}.conf"
            config.write_text(
                "\n".join(
                    [
                        "Port 22",
                        f"ListenAddress {address}",
                        f"HostKey {host_key}",
                        f"PidFile {self.dir / f'sshd_{host}.pid'}",
                        f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                        "PermitRootLogin prohibit-password",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        "PrintMotd no",
                        "MaxStartups 100:30:200",
                        "MaxSessions 100",
                        "LogLevel ERROR",
                        "",
                    ]
                )
            )
            log = open(self.dir / f"sshd_{host}.log", "wb")  # noqa: SIM115 - lives as long as sshd
            self.sshd.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", host, SSHD, "-D", "-e", "-f", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text("\n".join(known) + "\n")
        for host, address, proc in zip(self.hosts, self.addresses, self.sshd, strict=True):
            self._wait_listening(host, address, proc)

    def _wait_listening(self, host: str, address: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = (self.dir / f"sshd_{host}.log").read_text()
                raise RuntimeError(f"sshd in {host} exited with {proc.returncode}: {log}")
            probe = subprocess.run(
                ["ip", "netns", "exec", host, sys.executable, "-c", _PROBE, address],
                capture_output=True,
            )
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"sshd in {host} is not listening on {address}:22 after 15 s")

    # -- using ------------------------------------------------------------------------------

    def ssh_flags(self, known_hosts: Path | None = None) -> list[str]:
        """distgnn-launch flags that log in with the cluster's key and check its host keys."""
        return [
            "--ssh-key",
            str(self.client_key),
            "--ssh-option",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "--ssh-option",
            "GlobalKnownHostsFile=/dev/null",
        ]

    def ssh(self, from_host: int, to_address: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``command`` over ssh, from inside host ``from_host``."""
        argv = ["ip", "netns", "exec", self.hosts[from_host], "ssh", "-T", "-o", "BatchMode=yes"]
        argv += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-i", str(self.client_key), to_address, command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def exec_prefix(self, host: int) -> list[str]:
        """Prefix that runs a command inside host ``host`` (``ip netns exec`` execs: the pid stays the command's)."""
        return ["ip", "netns", "exec", self.hosts[host]]

    def job_processes(self) -> dict[str, list[int]]:
        """Processes in each host namespace other than its sshd listener (should be none between jobs)."""
        out = {}
        for host, proc in zip(self.hosts, self.sshd, strict=True):
            out[host] = [p for p in _namespace_pids(host) if p != proc.pid]
        return out

    def close(self) -> None:
        for proc in self.sshd:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in reversed(self.created):
            _kill_namespace_processes(name)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        self.created.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


_PROBE = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=1).close()"


def netns_cluster_fixture(num_hosts: int = 2):
    """A pytest fixture body: yields a NetnsCluster, or skips with the reason it cannot be built."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    remove_stale_namespaces()
    cluster = NetnsCluster(num_hosts)
    try:
        yield cluster
    finally:
        cluster.close()


def free_port(span: int = 1) -> int:
    """A port P with P .. P + span - 1 all free on 127.0.0.1, below the kernel's ephemeral range.

    A port the kernel hands out for bind(0) lies in the ephemeral range, where the outgoing connections of
    other tests (torchrun, ZeroMQ) are given local ports too, so P + 10 can be taken by the time a job binds it.
    """
    low_ephemeral = 32768
    with contextlib.suppress(OSError, ValueError):
        low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, max(10001, low_ephemeral - span))
        if all(_bindable(port) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} consecutive free ports found below {low_ephemeral}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
