"""The typed job configuration, read once from arguments or the launcher's environment.

Nothing else in distgnn reads ``os.environ``: ``JobConfig.from_env`` does it in
``distgnn.initialize`` and the result is passed down.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from distgnn.errors import ConfigError
from distgnn.launch import env as E
from distgnn.launch.ip_config import IpConfigError, Machine, read_ip_config

DEFAULT_RPC_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JobConfig:
    """Everything a server or trainer process needs to find and talk to the cluster."""

    ip_config: Path
    machines: tuple[Machine, ...]
    part_config: Path | None
    job_id: str
    token: str
    machine_id: int = 0
    num_servers: int = 1
    num_trainers: int = 1
    num_samplers: int = 0
    role: str = "trainer"
    server_id: int = 0
    curve: bool = False
    rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.role not in ("server", "trainer"):
            raise ConfigError(f"role must be 'server' or 'trainer', got {self.role!r}")
        if not 0 <= self.machine_id < len(self.machines):
            raise ConfigError(
                f"machine id {self.machine_id} out of range: {self.ip_config} lists {len(self.machines)} machines"
            )
        if self.num_servers < 1 or self.num_trainers < 0 or self.num_samplers < 0:
            raise ConfigError(
                f"need num_servers >= 1, num_trainers >= 0, num_samplers >= 0; got "
                f"{self.num_servers}, {self.num_trainers}, {self.num_samplers}"
            )
        if not 0 <= self.server_id < self.num_servers:
            raise ConfigError(f"server id {self.server_id} out of range [0, {self.num_servers})")
        if not self.token:
            raise ConfigError("the job token is empty; every job needs a secret token for RPC authentication")
        if self.rpc_timeout_s <= 0:
            raise ConfigError(f"rpc timeout must be positive, got {self.rpc_timeout_s}")

    @property
    def num_machines(self) -> int:
        return len(self.machines)

    def server_address(self, machine_id: int, server_id: int) -> tuple[str, int]:
        return self.machines[machine_id].server_address(server_id)

    def with_(self, **changes) -> JobConfig:
        return replace(self, **changes)

    @classmethod
    def create(
        cls,
        ip_config: str | os.PathLike,
        part_config: str | os.PathLike | None = None,
        *,
        job_id: str | None = None,
        token: str | None = None,
        **kwargs,
    ) -> JobConfig:
        """Build a config from arguments; a fresh job id and token are generated if absent."""
        try:
            machines = tuple(read_ip_config(ip_config))
        except IpConfigError as exc:
            raise ConfigError(str(exc)) from None
        return cls(
            ip_config=Path(ip_config),
            machines=machines,
            part_config=Path(part_config) if part_config is not None else None,
            job_id=job_id or f"j{secrets.token_hex(4)}",
            token=token or secrets.token_hex(16),
            **kwargs,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> JobConfig:
        """Read the launcher's environment (``distgnn.launch.env``); ``overrides`` win."""
        environ = os.environ if environ is None else environ

        get = environ.get

        def get_int(name: str, default: int) -> int:
            value = get(name)
            if value is None:
                return default
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"environment variable {name} must be an integer, got {value!r}") from None

        ip_config = overrides.pop("ip_config", None) or get(E.IP_CONFIG)
        if ip_config is None:
            raise ConfigError(f"no ip_config: pass ip_config=... or start through distgnn-launch (sets {E.IP_CONFIG})")
        token = overrides.pop("token", None) or get(E.TOKEN)
        if not token:
            raise ConfigError(f"no job token: {E.TOKEN} is unset; start the job through distgnn-launch or LocalCluster")
        job_id = overrides.pop("job_id", None) or get(E.JOB_ID)
        if not job_id:
            raise ConfigError(f"no job id: {E.JOB_ID} is unset")
        timeout = get(E.RPC_TIMEOUT)
        try:
            rpc_timeout_s = float(timeout) if timeout is not None else DEFAULT_RPC_TIMEOUT_S
        except ValueError:
            raise ConfigError(f"environment variable {E.RPC_TIMEOUT} must be a number, got {timeout!r}") from None
        fields = dict(
            part_config=get(E.PART_CONFIG),
            machine_id=get_int(E.MACHINE_ID, 0),
            num_servers=get_int(E.NUM_SERVERS, 1),
            num_trainers=get_int(E.NUM_TRAINERS, 1),
            num_samplers=get_int(E.NUM_SAMPLERS, 0),
            role=get(E.ROLE, "trainer"),
            server_id=get_int(E.SERVER_ID, 0),
            curve=get(E.CURVE, "0") == "1",
            rpc_timeout_s=rpc_timeout_s,
        )
        fields.update(overrides)
        return cls.create(ip_config, job_id=job_id, token=token, **fields)

    def to_env(self) -> dict[str, str]:
        """The environment variables that make ``from_env`` rebuild this config."""
        out = {
            E.IP_CONFIG: str(self.ip_config),
            E.JOB_ID: self.job_id,
            E.TOKEN: self.token,
            E.MACHINE_ID: str(self.machine_id),
            E.NUM_SERVERS: str(self.num_servers),
            E.NUM_TRAINERS: str(self.num_trainers),
            E.NUM_SAMPLERS: str(self.num_samplers),
            E.ROLE: self.role,
            E.SERVER_ID: str(self.server_id),
            E.CURVE: "1" if self.curve else "0",
            E.RPC_TIMEOUT: repr(self.rpc_timeout_s),
        }
        if self.part_config is not None:
            out[E.PART_CONFIG] = str(self.part_config)
        return out
