"""How the launcher reaches a machine: OpenSSH, or plain subprocesses for ``--local``.

A transport turns "run this argv on machine i, in the workspace, with this
environment" into a local ``subprocess`` argv. Both transports run the same
wrapper (``remote.py``) and deliver the job token the same way, on stdin.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from dataclasses import dataclass

from distgnn.launch.plan import LaunchError, remote_shell_command

SSH_CONNECT_TIMEOUT_S = 5
#: ssh's own exit status when the connection (not the remote command) failed.
SSH_FAILED = 255


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous port of a job whose machines all are this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Command:
    """A local subprocess to start: argv, its full environment, its working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None


class LocalTransport:
    """Every machine is this host: the process runs directly, in the workspace."""

    name = "local"

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace

    def command(self, host: str, argv: list[str], env: dict[str, str]) -> Command:
        return Command(list(argv), {**os.environ, **env}, self.workspace)

    def describe_failure(self, host: str, returncode: int, stderr: str) -> str | None:
        return None


class SshTransport:
    """OpenSSH in batch mode: no password or host-key prompts; a changed host key is an error."""

    name = "ssh"

    def __init__(
        self,
        workspace: str,
        port: int = 22,
        user: str | None = None,
        key: str | None = None,
        options: tuple[str, ...] = (),
    ) -> None:
        self.workspace = workspace
        self.port = port
        base = [
            "ssh",
            "-T",  # no terminal: the remote side sees our pipes, and EOF on stdin when we go away
            "-p",
            str(port),
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
            # Known hosts are checked; an unknown host is recorded on first contact, a changed key fails.
            "-o",
            "StrictHostKeyChecking=accept-new",
            # A machine that dies or drops off the network ends the connection within ~15 s.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "LogLevel=ERROR",
        ]
        if user:
            base += ["-l", user]
        if key:
            base += ["-i", key, "-o", "IdentitiesOnly=yes"]
        for option in options:
            base += ["-o", option]
        self.base = base

    def command(self, host: str, argv: list[str], env: dict[str, str]) -> Command:
        line = remote_shell_command(self.workspace, env, argv)
        return Command([*self.base, host, line], dict(os.environ), None)

    def describe_failure(self, host: str, returncode: int, stderr: str) -> str | None:
        """A clear sentence when ssh itself failed (exit 255), else None."""
        if returncode != SSH_FAILED:
            return None
        said = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:]).rstrip(".") or "no message"
        hint = ""
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key verification failed" in stderr:
            hint = " The host key differs from the one in known_hosts: check the machine, then fix known_hosts."
        elif "Permission denied" in stderr:
            hint = " Install your public key in the machine's authorized_keys (or pass --ssh-key/--ssh-user)."
        elif "Connection refused" in stderr:
            hint = f" Is sshd listening on port {self.port} there (--ssh-port)?"
        elif "timed out" in stderr or "No route to host" in stderr or "unreachable" in stderr:
            hint = " The machine is unreachable: check the address in ip_config and the network/firewall."
        return f"ssh to {host} port {self.port} failed: {said}.{hint}"

    def __repr__(self) -> str:
        return f"SshTransport({shlex.join(self.base)})"


def run_short(transport, host: str, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run a short command (preflight, sweep) on ``host``; a timeout counts as ssh failure."""
    cmd = transport.command(host, argv, {})
    try:
        return subprocess.run(
            cmd.argv,
            env=cmd.env,
            cwd=cmd.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd.argv, SSH_FAILED, "", f"no answer within {timeout_s:g} s (timed out)")
    except FileNotFoundError:
        hint = "install the OpenSSH client" if transport.name == "ssh" else "check the training command's interpreter"
        raise LaunchError(f"cannot run {cmd.argv[0]!r} on this machine: {hint}") from None
