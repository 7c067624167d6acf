"""The ranks of a distributed partition job and every exchange between them (torch.distributed, gloo).

A :class:`RankGroup` is made from the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``). Data moves only through collectives: :meth:`RankGroup.alltoallv` sends rows to chosen
ranks with ``all_to_all_single`` in rounds of at most ``message_bytes`` per rank (counts exchanged first,
so every rank knows the number of rounds), and small tables go through ``all_gather``/``all_reduce``.
Bytes cross as raw ``uint8`` buffers and JSON, never pickle.

A watchdog thread bumps this rank's heartbeat counter in the rendezvous store every second and reads the
others'; a rank whose counter stands still for ``DEAD_AFTER_S`` (killed, its machine gone) or a store
that stops answering ends this process with one line naming the rank (:class:`RankFailure`), so a lost
rank never leaves the others waiting in a collective.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import ConfigError, DistGNNError

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
# A rank whose heartbeat has not moved for this long is dead; long enough for a rank busy in a C call
# that holds the GIL (METIS on the coarse graph), short enough that everyone exits within 30 s.
DEAD_AFTER_S = 20.0
ENV_NAMES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Exit status of a rank that stops because another one died.
PEER_LOST_EXIT = 3
# Up to this many distinct keys, ordering rows by destination scans once per key instead of sorting.
FEW_KEYS = 4


def _rows_per_round(rows: np.ndarray, world: int, message_bytes: int) -> int:
    """Rows one rank sends each peer in one round of an exchange bounded by ``message_bytes`` (at least one)."""
    row_bytes = max(1, int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize)
    return max(1, message_bytes // world // row_bytes)


class RankFailure(DistGNNError):
    """Another rank of the job died or stopped answering."""


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"environment variable {name} must be an integer, got {value!r}") from None


class RankGroup:
    """This process's rank in the job and the collectives over all ranks.

    Args:
        timeout_s: deadline of the rendezvous and of one collective's wait (a dead rank is found sooner by
            the watchdog).
        on_peer_lost: called (from the watchdog thread) before the process exits because a rank died, to
            remove what this rank started (a staging directory).
    """

    def __init__(
        self,
        timeout_s: float = 1800.0,
        on_peer_lost: Callable[[], None] | None = None,
        dead_after_s: float = DEAD_AFTER_S,
    ):
        missing = [name for name in ENV_NAMES if name not in os.environ]
        if missing:
            raise ConfigError(
                f"a distributed partition job needs the torchrun environment; {', '.join(missing)} not set "
                "(start it with --local, distgnn-launch, torchrun or srun)"
            )
        self.rank = _env_int("RANK")
        self.world = _env_int("WORLD_SIZE")
        self.rounds = 0  # all_to_all rounds so far
        self.bytes_sent = 0
        self._on_peer_lost = on_peer_lost
        self.dead_after_s = dead_after_s
        addr, port = os.environ["MASTER_ADDR"], _env_int("MASTER_PORT")
        timeout = timedelta(seconds=timeout_s)
        # Under torchrun the agent hosts the store; otherwise rank 0 does.
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self._store_host = "the torchrun agent" if agent_store else "rank 0"
        try:
            self.store = dist.TCPStore(
                addr, port, self.world, is_master=self.rank == 0 and not agent_store, timeout=timeout
            )
            dist.init_process_group("gloo", store=self.store, rank=self.rank, world_size=self.world, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            raise RankFailure(f"rank {self.rank}: rendezvous at {addr}:{port} failed: {exc}") from None
        self._stop = threading.Event()
        self._watch = threading.Thread(
            target=self._watchdog, args=(addr, port), name="partition-heartbeat", daemon=True
        )
        self._watch.start()

    # -- failure detection ------------------------------------------------------------------------

    def _watchdog(self, addr: str, port: int) -> None:
        try:
            store = dist.TCPStore(addr, port, self.world, is_master=False, timeout=timedelta(seconds=self.dead_after_s))
        except RuntimeError:
            self._peer_lost(f"the rendezvous store ({self._store_host}) at {addr}:{port} does not answer")
            return
        last = [-1] * self.world
        moved = [time.monotonic()] * self.world
        while not self._stop.wait(HEARTBEAT_S):
            try:
                store.add(f"partition/heartbeat/{self.rank}", 1)
                now = time.monotonic()
                for r in range(self.world):
                    if r == self.rank:
                        continue
                    if store.check([f"partition/done/{r}"]):
                        moved[r] = now
                        continue
                    count = store.add(f"partition/heartbeat/{r}", 0)
                    if count != last[r]:
                        last[r], moved[r] = count, now
                    elif now - moved[r] > self.dead_after_s:
                        self._peer_lost(f"rank {r} died or hangs (no heartbeat for {self.dead_after_s:g} s)")
                        return
            except RuntimeError:
                if self._stop.is_set():
                    return
                self._peer_lost(f"the rendezvous store ({self._store_host}) stopped answering: {self._store_host} died")
                return

    def _peer_lost(self, why: str) -> None:
        print(f"error: rank {self.rank} stops: {why}", file=sys.stderr, flush=True)
        if self._on_peer_lost is not None:
            with contextlib.suppress(OSError):
                self._on_peer_lost()
        os._exit(PEER_LOST_EXIT)

    def set_cleanup(self, cleanup: Callable[[], None]) -> None:
        """What to remove if the watchdog ends this process because another rank died."""
        self._on_peer_lost = cleanup

    def close(self, done: bool = True) -> None:
        """Stop the watchdog and leave the process group; ``done``: this rank finished its part (else the
        others see its heartbeat stop and name it)."""
        if done:
            with contextlib.suppress(RuntimeError):
                self.store.set(f"partition/done/{self.rank}", "1")
        self._stop.set()
        self._watch.join(timeout=2 * HEARTBEAT_S)
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- collectives ------------------------------------------------------------------------------

    def _run(self, what: str, op: Callable[[], object]) -> object:
        try:
            return op()
        except RuntimeError as exc:
            # A peer is gone: remove what this job wrote now, then give the watchdog the time to name the
            # dead rank and exit.
            if self._on_peer_lost is not None:
                with contextlib.suppress(OSError):
                    self._on_peer_lost()
            time.sleep(self.dead_after_s + 3 * HEARTBEAT_S)
            raise RankFailure(f"rank {self.rank}: {what} failed: {exc}") from None

    def barrier(self) -> None:
        self._run("barrier", lambda: dist.barrier())

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """``(world, *values.shape)``: every rank's ``values`` (int64 or float64, same shape on every rank)."""
        t = torch.from_numpy(np.ascontiguousarray(values))
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._run("all_gather", lambda: dist.all_gather(out, t))
        return np.stack([o.numpy() for o in out])

    def allreduce(self, values: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise sum / max / min over ranks of an int64 or float64 array."""
        t = torch.from_numpy(np.array(values, copy=True))
        reduce = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        self._run("all_reduce", lambda: dist.all_reduce(t, op=reduce))
        return t.numpy()

    def broadcast_json(self, value: object, root: int = 0) -> object:
        """``value`` of ``root`` on every rank, as JSON."""
        data = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8) if self.rank == root else None
        size = torch.tensor([0 if data is None else data.size], dtype=torch.int64)
        self._run("broadcast", lambda: dist.broadcast(size, src=root))
        buf = torch.from_numpy(data.copy()) if data is not None else torch.empty(int(size), dtype=torch.uint8)
        self._run("broadcast", lambda: dist.broadcast(buf, src=root))
        return json.loads(buf.numpy().tobytes().decode())

    def allgather_rows(self, rows: np.ndarray, counts: np.ndarray, message_bytes: int) -> np.ndarray:
        """Every rank's ``rows`` concatenated in rank order, in ``all_gather`` rounds of at most
        ``message_bytes`` received; ``counts``: ``(world,)`` rows of each rank, known to every rank."""
        rows = np.ascontiguousarray(rows)
        counts = np.asarray(counts, dtype=np.int64)
        row_shape, dtype = rows.shape[1:], rows.dtype
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        per_round = max(1, message_bytes // self.world // row_bytes)
        most = int(counts.max(initial=0))
        starts = np.concatenate([[0], np.cumsum(counts)])
        out = np.empty((int(counts.sum()), *row_shape), dtype=dtype)
        flat = rows.view(np.uint8).reshape(-1) if rows.size else np.empty(0, dtype=np.uint8)
        out_flat = out.view(np.uint8).reshape(-1) if out.size else np.empty(0, dtype=np.uint8)
        for lo in range(0, most, per_round):
            n = min(per_round, most - lo)
            send = np.zeros(n * row_bytes, dtype=np.uint8)
            mine = int(np.clip(counts[self.rank] - lo, 0, n)) * row_bytes
            send[:mine] = flat[lo * row_bytes : lo * row_bytes + mine]
            got = [torch.empty(n * row_bytes, dtype=torch.uint8) for _ in range(self.world)]
            self._run("all_gather", lambda got=got, send=send: dist.all_gather(got, torch.from_numpy(send)))
            for r in range(self.world):
                m = int(np.clip(counts[r] - lo, 0, n)) * row_bytes
                begin = (int(starts[r]) + lo) * row_bytes
                out_flat[begin : begin + m] = got[r].numpy()[:m]
            self.rounds += 1
            self.bytes_sent += mine * (self.world - 1)
        return out

    def alltoallv(self, rows: np.ndarray, dest_counts: np.ndarray, message_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Send ``rows`` to ranks; returns ``(received rows, (world,) rows received from each rank)``.

        Args:
            rows: ``(n, ...)`` array of one dtype, sorted by destination: the first ``dest_counts[0]`` rows
                go to rank 0, and so on. Every rank passes the same dtype and row shape.
            dest_counts: ``(world,)`` int64.
            message_bytes: bound of what one rank sends in one round (and receives: at most
                ``message_bytes / world`` from each peer); a round carries at least one row per peer.

        Received rows are ordered by source rank, each source's rows in their sent order, whatever
        the number of rounds.
        """
        dest_counts = np.asarray(dest_counts, dtype=np.int64)
        if self.world == 1:  # every row is this rank's own
            if dest_counts.shape != (1,) or int(dest_counts[0]) != rows.shape[0]:
                raise ValueError(f"alltoallv: dest_counts {dest_counts.tolist()} do not add up to {rows.shape[0]} rows")
            return np.array(rows, order="C", copy=True), dest_counts.copy()
        rows = np.ascontiguousarray(rows)
        counts = self.allgather(dest_counts)  # counts[src, dst]
        recv_counts = counts[:, self.rank]
        out = np.empty((int(recv_counts.sum()), *rows.shape[1:]), dtype=rows.dtype)
        recv_starts = np.concatenate([[0], np.cumsum(recv_counts)])
        one_round = counts.max(initial=0) <= _rows_per_round(rows, self.world, message_bytes)
        for got, first, n in self.alltoallv_rounds(rows, counts, message_bytes, out if one_round else None):
            if one_round:
                break  # received in place
            at = 0
            for s in range(self.world):
                out[recv_starts[s] + first[s] : recv_starts[s] + first[s] + n[s]] = got[at : at + n[s]]
                at += int(n[s])
        return out, recv_counts

    def alltoallv_rounds(
        self, rows: np.ndarray, counts: np.ndarray, message_bytes: int, recv: np.ndarray | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rounds of :meth:`alltoallv`, each's received rows handed over as they arrive.

        Args:
            rows: as in :meth:`alltoallv` (C-contiguous), sorted by destination.
            counts: ``(world, world)`` rows each rank sends each rank (``counts[src, dst]``), known to all.
            message_bytes: as in :meth:`alltoallv`.
            recv: a buffer of ``rows``' dtype and row shape to receive into where it is large enough (else
                one is allocated); reused by the caller across exchanges, no fresh pages each time.

        Yields, per round, ``(got, first, n)``: ``got`` holds, by source rank, rows ``first[s] ..
        first[s] + n[s]`` of what source ``s`` sends this rank; it is valid until the next round.
        """
        counts = np.asarray(counts, dtype=np.int64)
        row_shape, dtype = rows.shape[1:], rows.dtype
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        per_round = _rows_per_round(rows, self.world, message_bytes)
        num_rounds = int(-(-counts.max() // per_round)) if counts.size else 0
        dest_counts, recv_counts = counts[self.rank], counts[:, self.rank]
        send_starts = np.concatenate([[0], np.cumsum(dest_counts)])
        flat = rows.view(np.uint8).reshape(-1) if rows.size else np.empty(0, dtype=np.uint8)
        most = int(np.minimum(recv_counts, per_round).sum()) if num_rounds else 0
        if recv is None or recv.shape[0] < most or recv.dtype != dtype or recv.shape[1:] != row_shape:
            recv = np.empty((most, *row_shape), dtype=dtype)
        recv_flat = recv.view(np.uint8).reshape(-1) if recv.size else np.empty(0, dtype=np.uint8)
        for k in range(num_rounds):
            lo = k * per_round
            send_n = np.clip(dest_counts - lo, 0, per_round)
            recv_n = np.clip(recv_counts - lo, 0, per_round)
            if num_rounds == 1:
                send = flat  # one round: the rows are already laid out by destination, no staging copy
            else:
                send = np.concatenate(
                    [
                        flat[(send_starts[d] + lo) * row_bytes : (send_starts[d] + lo + send_n[d]) * row_bytes]
                        for d in range(self.world)
                    ]
                )
            got = int(recv_n.sum())
            self._all_to_all(recv_flat[: got * row_bytes], send, recv_n * row_bytes, send_n * row_bytes)
            del send
            yield recv[:got], np.minimum(recv_counts, lo), recv_n

    def _all_to_all(self, recv: np.ndarray, send: np.ndarray, recv_bytes: np.ndarray, send_bytes: np.ndarray) -> None:
        """One ``all_to_all_single`` round of uint8 buffers split by byte counts per rank."""
        out, inp = torch.from_numpy(recv), torch.from_numpy(send)
        self._run(
            "all_to_all",
            lambda: dist.all_to_all_single(out, inp, recv_bytes.tolist(), send_bytes.tolist()),
        )
        self.rounds += 1
        self.bytes_sent += int(send_bytes.sum())

    def order_by_rank(self, ranks: np.ndarray) -> np.ndarray:
        """Stable order of positions by ``ranks`` (any small non-negative keys: ranks, partitions): for a few
        distinct keys one scan per key, else numpy's radix sort of 8- or 16-bit keys."""
        bound = int(ranks.max(initial=-1)) + 1
        if bound <= FEW_KEYS:
            out = np.empty(ranks.shape[0], dtype=np.int64)
            at = 0
            for key in range(bound):
                positions = np.flatnonzero(ranks == key)
                out[at : at + positions.shape[0]] = positions
                at += positions.shape[0]
            return out
        small = np.uint8 if bound <= (1 << 8) else np.int16 if bound <= (1 << 15) else np.int64
        return np.argsort(ranks.astype(small, copy=False), kind="stable")

    def send_to(self, dest: np.ndarray, columns: np.ndarray, message_bytes: int) -> np.ndarray:
        """Rows of ``columns`` (``(n, ...)``) each to rank ``dest[i]``; the received rows, by source rank."""
        order = self.order_by_rank(dest)
        counts = np.bincount(dest, minlength=self.world).astype(np.int64)
        received, _ = self.alltoallv(columns[order], counts, message_bytes)
        return received

    def lookup(
        self, ids: np.ndarray, owner: np.ndarray, answer: Callable[[np.ndarray], np.ndarray], message_bytes: int
    ) -> np.ndarray:
        """``answer`` evaluated for each of ``ids`` on its ``owner`` rank, in the order of ``ids``.

        Every rank calls it together; ``answer(ids)`` maps int64 ids this rank owns to int64 values.
        """
        order = self.order_by_rank(owner)
        counts = np.bincount(owner, minlength=self.world).astype(np.int64)
        asked, asked_counts = self.alltoallv(np.asarray(ids, dtype=np.int64)[order], counts, message_bytes)
        replies, _ = self.alltoallv(answer(asked).astype(np.int64, copy=False), asked_counts, message_bytes)
        out = np.empty(len(ids), dtype=np.int64)
        out[order] = replies
        return out
