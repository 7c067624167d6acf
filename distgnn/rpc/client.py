"""The trainer side of RPC: one DEALER per server, pipelined requests, deadlines.

``send`` queues a request and returns its request id at once; ``wait`` collects
the replies of several ids (in any arrival order) under one deadline. A step
sends one request per destination machine first and then waits for all of
them, so the machines work in parallel.

Sockets are not thread-safe, so every thread gets its own DEALERs (and request
ids) on first use, and a forked child (a sampler worker) gets a fresh ZeroMQ
context instead of the parent's.

A dead server is noticed within seconds, not at the deadline: every DEALER
sends ZeroMQ heartbeats (a peer that stops answering them for
``HEARTBEAT_TIMEOUT_MS`` is disconnected; libzmq answers them on the server's
I/O thread, so a busy server keeps its connections) and has a socket monitor.
A ``wait`` that finds a connection closed after it was established fails the
requests pending on it with ``ServerLostError``: a request already sent on a
closed connection gets no reply, and servers do not come back within a job.

``post`` sends a request nobody waits for now (a sparse optimizer's push): its
reply is collected, and its error raised, by a later ``settle`` of its tag (the
sender's next read of the same rows, a barrier, a checkpoint, ``close``), under
the usual deadline and liveness checks. Requests on one DEALER reach their
server in order, and a server answers one request at a time, so a later request
on the same connection already sees what a posted one wrote.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

import distgnn.rpc.wire as wire
from distgnn.config import JobConfig
from distgnn.errors import ProtocolError, RpcError, RpcTimeoutError, ServerLostError
from distgnn.rpc.auth import secure_client

log = logging.getLogger(__name__)

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000
# A wait polls its sockets in slices this long and looks at the connection monitors between slices.
_LIVENESS_SLICE_MS = 200
_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
# A thread's posted requests are settled once this many are unanswered, so replies and errors never pile up.
MAX_POSTED = 256


@dataclass
class Reply:
    """A successful reply: its header (``ok``, ``rid``, op-specific fields) and arrays."""

    header: dict[str, Any]
    arrays: list[np.ndarray]


@dataclass
class _Pending:
    key: tuple[int, int]  # (machine_id, server_id)
    op: str


class _ThreadState:
    def __init__(self) -> None:
        self.sockets: dict[tuple[int, int], zmq.Socket] = {}
        self.monitors: dict[tuple[int, int], zmq.Socket] = {}
        # Per server: None before the first handshake, True while connected, False once the connection closed.
        self.connected: dict[tuple[int, int], bool | None] = {}
        self.pending: dict[int, _Pending] = {}
        self.done: dict[int, Reply | RpcError] = {}
        self.rids = itertools.count(1)
        self.posted: dict[Hashable, list[int]] = {}  # tag -> ids of posted requests not settled yet
        self.num_posted = 0
        self.bytes_sent = 0  # message bytes, this thread's requests and their replies
        self.bytes_received = 0


def _size(frame: Any) -> int:
    """Bytes in a frame: a zmq.Frame or bytes (len), or an array's memoryview (len would count rows)."""
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


class RpcClient:
    """Talks to every server of a job described by ``config``.

    Args:
        config: the job (addresses, token, curve flag, default deadline).
        timeout_s: default deadline of a ``wait``; ``config.rpc_timeout_s`` if None.
    """

    def __init__(self, config: JobConfig, timeout_s: float | None = None):
        self.config = config
        self.timeout_s = config.rpc_timeout_s if timeout_s is None else timeout_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._ctx = zmq.Context()
        self._local = threading.local()
        self._all_sockets: list[zmq.Socket] = []
        self._states: list[_ThreadState] = []
        self._lock = threading.Lock()

    def _state(self) -> _ThreadState:
        if os.getpid() != self._pid:
            # A forked child must not touch the parent's context; start over.
            self._reset()
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState()
            with self._lock:
                self._states.append(state)
        return state

    def traffic(self) -> tuple[int, int]:
        """``(bytes sent, bytes received)`` in messages by this process's threads since the client was made
        (a forked sampler worker counts its own)."""
        with self._lock:
            return sum(s.bytes_sent for s in self._states), sum(s.bytes_received for s in self._states)

    def _socket(self, state: _ThreadState, key: tuple[int, int]) -> zmq.Socket:
        sock = state.sockets.get(key)
        if sock is None:
            machine_id, server_id = key
            if not 0 <= machine_id < self.config.num_machines or not 0 <= server_id < self.config.num_servers:
                raise RpcError(
                    f"no server {server_id} on machine {machine_id}: the job has {self.config.num_machines} "
                    f"machines with {self.config.num_servers} servers each"
                )
            sock = self._ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.sndhwm = 0
            sock.rcvhwm = 0
            sock.sndtimeo = int(self.timeout_s * 1000)
            sock.heartbeat_ivl = HEARTBEAT_IVL_MS
            sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS
            secure_client(sock, self.config.token, self.config.curve)
            monitor = sock.get_monitor_socket(_MONITORED)
            host, port = self.config.server_address(machine_id, server_id)
            sock.connect(f"tcp://{host}:{port}")
            state.sockets[key] = sock
            state.monitors[key] = monitor
            state.connected[key] = None
            with self._lock:
                self._all_sockets.extend((sock, monitor))
        return sock

    def describe(self, machine_id: int, server_id: int) -> str:
        host, port = self.config.server_address(machine_id, server_id)
        return f"server {server_id} of machine {machine_id} (partition {machine_id}) at {host}:{port}"

    def send(
        self,
        machine_id: int,
        op: str,
        fields: dict[str, Any] | None = None,
        arrays: Sequence[np.ndarray] = (),
        server_id: int = 0,
    ) -> int:
        """Queue request ``op`` for one server; returns its request id for ``wait``."""
        state = self._state()
        key = (machine_id, server_id)
        sock = self._socket(state, key)
        rid = next(state.rids)
        frames = wire.encode({**(fields or {}), "op": op, "rid": rid}, arrays)
        try:
            sock.send_multipart(frames, copy=False)
        except zmq.Again:
            raise RpcTimeoutError(
                f"could not queue '{op}' for {self.describe(*key)} within {self.timeout_s}s; is the server alive?"
            ) from None
        state.pending[rid] = _Pending(key, op)
        state.bytes_sent += sum(_size(f) for f in frames)
        return rid

    def post(
        self,
        machine_id: int,
        op: str,
        fields: dict[str, Any] | None = None,
        arrays: Sequence[np.ndarray] = (),
        tag: Hashable = None,
        server_id: int = 0,
    ) -> None:
        """Send request ``op`` without waiting for its reply; ``settle(tag)`` collects it later.

        ``tag`` names what the request does (it prefixes the request's error when ``settle`` raises it).
        The arrays are sent without copies, possibly after ``post`` returns: do not modify them until the
        tag is settled.
        """
        state = self._state()
        if state.num_posted >= MAX_POSTED:
            self.settle()
        rid = self.send(machine_id, op, fields, arrays, server_id)
        state.posted.setdefault(tag, []).append(rid)
        state.num_posted += 1

    def has_posted(self, tag: Hashable) -> bool:
        """Whether this thread posted requests under ``tag`` that are not settled yet."""
        return tag in self._state().posted

    def settle(self, tags: Iterable[Hashable] | None = None, timeout_s: float | None = None) -> None:
        """Collect the replies of this thread's posted requests under ``tags`` (all tags if None).

        Every one of them is collected; then the first failure (the server's error, a timeout, a lost server)
        is raised as the same error class, its message starting with the tag.
        """
        state = self._state()
        if not state.posted:
            return
        todo = list(state.posted) if tags is None else [tag for tag in tags if tag in state.posted]
        failures = []
        for tag in todo:
            rids = state.posted.pop(tag)
            state.num_posted -= len(rids)
            try:
                self.wait(rids, timeout_s)
            except RpcError as exc:
                failures.append(type(exc)(f"{tag} (sent without waiting for its reply): {exc}"))
        if failures:
            if len(failures) > 1:
                log.error("%d more posted requests failed: %s", len(failures) - 1, "; ".join(map(str, failures[1:])))
            raise failures[0]

    def wait(self, rids: Sequence[int], timeout_s: float | None = None) -> list[Reply]:
        """Replies of ``rids`` in the same order; raises the first server error or a timeout."""
        state = self._state()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        for rid in rids:
            if rid not in state.pending and rid not in state.done:
                raise RpcError(f"request id {rid} was not sent by this thread or was already collected")
        missing = [rid for rid in rids if rid not in state.done]
        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._give_up(state, rids, missing, timeout_s)
            keys = {state.pending[rid].key for rid in missing}
            sockets = [state.sockets[key] for key in keys]
            timeout_ms = max(1, min(int(remaining * 1000), _LIVENESS_SLICE_MS))
            if len(sockets) == 1:  # the common case; a Poller costs more than the wait itself for small requests
                ready = sockets if sockets[0].poll(timeout_ms) else []
            else:
                poller = zmq.Poller()
                for sock in sockets:
                    poller.register(sock, zmq.POLLIN)
                ready = [sock for sock, _ in poller.poll(timeout_ms)]
            for sock in ready:
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._accept(state, frames)
            if not ready:
                self._fail_lost(state, keys)
            missing = [rid for rid in missing if rid not in state.done]
        results = [state.done.pop(rid) for rid in rids]
        for result in results:
            if isinstance(result, RpcError):
                raise result
        return results

    def _accept(self, state: _ThreadState, frames: list) -> None:
        state.bytes_received += sum(_size(f) for f in frames)
        try:
            header, arrays = wire.decode(frames)
        except ProtocolError as exc:
            log.warning("dropping a malformed reply: %s", exc)
            return
        pending = state.pending.pop(header["rid"], None)
        if pending is None:
            log.debug("dropping a late reply to request %s", header["rid"])
            return
        if header.get("ok") is True:
            state.done[header["rid"]] = Reply(header, arrays)
        else:
            error = header.get("error", "no error message")
            state.done[header["rid"]] = RpcError(f"'{pending.op}' on {self.describe(*pending.key)} failed: {error}")

    def _fail_lost(self, state: _ThreadState, keys: set[tuple[int, int]]) -> None:
        """Read the connection monitors of ``keys``; fail the pending requests of servers whose connection closed."""
        for key in keys:
            monitor = state.monitors[key]
            while True:
                try:
                    event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))["event"]
                except zmq.Again:
                    break
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    state.connected[key] = True
                elif event == zmq.EVENT_DISCONNECTED and state.connected[key]:
                    state.connected[key] = False
            if state.connected[key] is not False:
                continue
            for rid, pending in list(state.pending.items()):
                if pending.key == key:
                    del state.pending[rid]
                    state.done[rid] = ServerLostError(
                        f"'{pending.op}' on {self.describe(*key)} failed: the connection to the server closed "
                        "while the request was pending (the server died or stopped answering heartbeats); "
                        "check that server's log"
                    )

    def _give_up(self, state: _ThreadState, rids: Sequence[int], missing: list[int], timeout_s: float) -> None:
        first = state.pending[missing[0]]
        for rid in rids:
            state.pending.pop(rid, None)
            state.done.pop(rid, None)
        raise RpcTimeoutError(
            f"no reply to '{first.op}' from {self.describe(*first.key)} within {timeout_s}s "
            f"({len(missing)} of {len(rids)} requests unanswered); is the server alive? check its log"
        )

    def call(
        self,
        machine_id: int,
        op: str,
        fields: dict[str, Any] | None = None,
        arrays: Sequence[np.ndarray] = (),
        server_id: int = 0,
        timeout_s: float | None = None,
    ) -> Reply:
        """``send`` then ``wait`` for one request."""
        return self.wait([self.send(machine_id, op, fields, arrays, server_id)], timeout_s)[0]

    def close(self) -> None:
        """Settle the calling thread's posted requests, then close every socket this process opened (from any
        thread) and the context. A posted request that failed is logged, not raised (close runs in cleanup)."""
        if os.getpid() != self._pid:
            return
        state = getattr(self._local, "state", None)
        try:
            if state is not None:
                self.settle()
        except RpcError as exc:
            log.error("closing the RPC client: %s", exc)
        with self._lock:
            unsettled = sum(s.num_posted for s in self._states)
        if unsettled:
            log.warning("closing the RPC client with %d posted requests of other threads unsettled", unsettled)
        with self._lock:
            for sock in self._all_sockets:
                if sock.type == zmq.DEALER:
                    sock.disable_monitor()
                sock.close(linger=0)
            self._all_sockets.clear()
        self._ctx.term()
        self._local = threading.local()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
