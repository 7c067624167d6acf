"""The ``ip_config`` file: one machine per line, ``IP [PORT]``.

Line i (ignoring comments and blank lines) is machine i, which holds
partition i. Server j of a machine listens on ``PORT + j``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 30050


class IpConfigError(ValueError):
    """The ip_config file is missing or has a malformed line."""


@dataclass(frozen=True)
class Machine:
    """One line of an ip_config: the machine's address and its first server port."""

    ip: str
    port: int

    def server_address(self, server_id: int) -> tuple[str, int]:
        return self.ip, self.port + server_id


def parse_ip_config(text: str, source: str = "ip_config") -> list[Machine]:
    """Parse ip_config text; raises IpConfigError naming the line on bad input."""
    machines: list[Machine] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) > 2:
            raise IpConfigError(f"{source}:{lineno}: expected 'IP [PORT]', got {raw.strip()!r}")
        try:
            ip = str(ipaddress.ip_address(fields[0]))
        except ValueError:
            raise IpConfigError(f"{source}:{lineno}: {fields[0]!r} is not an IP address") from None
        port = DEFAULT_PORT
        if len(fields) == 2:
            if not fields[1].isdigit() or not 1 <= int(fields[1]) <= 65535:
                raise IpConfigError(f"{source}:{lineno}: port {fields[1]!r} is not a number in 1..65535")
            port = int(fields[1])
        machines.append(Machine(ip, port))
    if not machines:
        raise IpConfigError(f"{source}: no machines listed (expected one 'IP [PORT]' line per machine)")
    return machines


def read_ip_config(path: str | Path) -> list[Machine]:
    """Read and parse the ip_config file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise IpConfigError(f"cannot read ip_config {path}: {exc.strerror or exc}") from None
    return parse_ip_config(text, str(path))
