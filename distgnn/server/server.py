"""The graph server process: one ROUTER socket, one partition in shared memory.

Server 0 of a machine (the main server) loads the partition into shared
memory and removes it on exit; backups map it and answer reads. Writes
(``push``, ``init_data``) are accepted only by the main server: with one
writer per partition, concurrent ``push(add)`` from many trainers is applied
one request at a time and loses nothing.

The loop is single-threaded: a request is decoded, validated and answered
before the next; any failure becomes an error reply and the loop goes on.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field

import zmq

import distgnn.rpc.wire as wire
from distgnn.config import JobConfig
from distgnn.errors import ConfigError, DistGNNError
from distgnn.partition.format import read_meta
from distgnn.rpc.auth import secure_server
from distgnn.server import sampling
from distgnn.server.checkpoint_ops import CHECKPOINT_HANDLERS
from distgnn.server.handlers import HANDLERS, ServerState
from distgnn.server.store import load_partition
from distgnn.store import shm

log = logging.getLogger(__name__)

# How long a backup waits for its main server to publish the partition.
BACKUP_WAIT_S = 600.0
MAX_BARRIER_PARTIES = 1 << 16
OPS = {**HANDLERS, **CHECKPOINT_HANDLERS}


@dataclass
class _Barrier:
    parties: int
    waiting: list[tuple[bytes, int]] = field(default_factory=list)


class GraphServer:
    """Serves one partition on ``config.server_address(machine_id, server_id)`` until ``shutdown``."""

    def __init__(self, config: JobConfig):
        if config.role != "server":
            raise ConfigError(f"a graph server needs role 'server', got {config.role!r}")
        if config.part_config is None:
            raise ConfigError("a graph server needs part_config (the partition JSON)")
        self.config = config
        self.barriers: dict[str, _Barrier] = {}
        self.state: ServerState | None = None

    def _open_partition(self) -> shm.SharedPartition:
        cfg = self.config
        if cfg.server_id == 0:
            meta = read_meta(cfg.part_config)
            if meta.num_parts != cfg.num_machines:
                raise ConfigError(
                    f"{cfg.part_config} has {meta.num_parts} partitions but {cfg.ip_config} lists "
                    f"{cfg.num_machines} machines; one partition per machine"
                )
            return load_partition(cfg.job_id, cfg.machine_id, meta)
        return shm.SharedPartition.attach(cfg.job_id, cfg.machine_id, writable=True, wait_s=BACKUP_WAIT_S)

    def run(self) -> None:
        """Load or map the partition, then answer requests until shutdown or SIGTERM/SIGINT."""
        cfg = self.config
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.maxmsgsize = wire.MAX_MESSAGE_BYTES
        sock.sndhwm = 0
        auth = None
        try:
            self.state = ServerState(cfg, self._open_partition())
            # Load (or build, once) the sampling kernel before listening: a first build inside a
            # client's sample call could outlast that call's deadline.
            sampling.prepare()
            auth = secure_server(ctx, sock, cfg.token, cfg.curve)
            host, port = cfg.server_address(cfg.machine_id, cfg.server_id)
            sock.bind(f"tcp://{host}:{port}")
            log.info("server %d of machine %d listening on %s:%d", cfg.server_id, cfg.machine_id, host, port)
            self._loop(sock)
        except KeyboardInterrupt:
            log.info("server %d of machine %d interrupted", cfg.server_id, cfg.machine_id)
        finally:
            if cfg.server_id == 0:
                shm.remove_segments(cfg.job_id, cfg.machine_id)
            if auth is not None:
                auth.stop()
            # After 'shutdown' give its reply a moment to leave; otherwise drop whatever is queued.
            sock.close(linger=1000 if self.state is not None and self.state.stopping else 0)
            ctx.term()
            signal.signal(signal.SIGTERM, previous)

    def _loop(self, sock: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self.state.stopping:
            if not poller.poll(500):  # wake up now and then so signals are handled promptly
                continue
            while not self.state.stopping:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._serve_one(sock, frames)

    def _serve_one(self, sock: zmq.Socket, frames: list) -> None:
        identity, message = frames[0].bytes, frames[1:]
        rid = 0
        start = time.perf_counter()
        try:
            header, arrays = wire.decode(message)
            rid = header["rid"]
            op = header.get("op")
            if op == "barrier":
                self._barrier(sock, identity, rid, header)
                return
            handler = OPS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise DistGNNError(f"unknown op {op!r}; known: {sorted([*OPS, 'barrier'])}")
            fields, out = handler(self.state, header, arrays)
            reply = wire.encode({**fields, "ok": True, "rid": rid}, out)
        except Exception as exc:  # the server outlives every bad request
            if not isinstance(exc, DistGNNError):
                log.exception("request %d failed unexpectedly", rid)
            reply = wire.encode({"ok": False, "rid": rid, "error": f"{type(exc).__name__}: {exc}"})
        sock.send_multipart([identity, *reply], copy=False)
        log.debug("request %d served in %.3f ms", rid, 1e3 * (time.perf_counter() - start))

    def _barrier(self, sock: zmq.Socket, identity: bytes, rid: int, header: dict) -> None:
        """Hold the reply until ``parties`` requests with the same ``name`` arrived, then answer all."""
        name, parties = header.get("name"), header.get("parties")
        if not isinstance(name, str) or type(parties) is not int or not 1 <= parties <= MAX_BARRIER_PARTIES:
            raise DistGNNError(f"barrier needs a str 'name' and int 'parties' in [1, {MAX_BARRIER_PARTIES}]")
        barrier = self.barriers.setdefault(name, _Barrier(parties))
        if barrier.parties != parties:
            raise DistGNNError(f"barrier {name!r} has {barrier.parties} parties, this request says {parties}")
        barrier.waiting.append((identity, rid))
        if len(barrier.waiting) == parties:
            del self.barriers[name]
            for peer, peer_rid in barrier.waiting:
                sock.send_multipart([peer, *wire.encode({"ok": True, "rid": peer_rid})])


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
