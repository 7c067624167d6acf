"""Warming a memory copy up: earlier events replayed through its memory only.

Under memory parallelism a copy that starts training mid-stream would start from an empty memory. At every
epoch's start the events before its segment are applied to an emptied memory in chunks the size of a training
batch, the way training applies a batch after its step (:meth:`~distgnn.temporal.train.BatchOutput.commit`):
the chunk's endpoints read their memory (pending mail through the GRU, with the current weights), that memory
is written back, and the chunk's events become mail. No sampling, no attention, no gradient. What it leaves
out against training on those events: the memory of a chunk's negatives and sampled neighbours is not
refreshed (their mail stays pending, applied when they are next read).

* :func:`replay_memory` applies ranges to a memory as it stands, chunk by chunk, finding each chunk's distinct
  endpoints and its mail on the device (a host sync per chunk on a GPU).
* :class:`StreamReplay` applies the events ``[0, stop)`` to an emptied memory, as :func:`replay_memory` does,
  with everything that depends on the events alone found once on the host: which endpoints of a chunk have
  mail to apply (from an empty memory: those seen in an earlier chunk), the time since their last update,
  which event's message each node keeps, and the final update and mail times. Per chunk on the device: the GRU
  on the pending endpoints and the mail writes, with fixed indices and no host sync; on a GPU the whole replay
  is captured in one CUDA graph right after its first (eager) run and replayed every epoch with the weights of
  that moment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal.step import capture

log = logging.getLogger(__name__)

WINDOW_READS = 1 << 16  # memory reads whose time encodings are computed in one go


@torch.no_grad()
def replay_memory(
    model: TGN,
    memory: NodeMemory,
    src: torch.Tensor,
    dst: torch.Tensor,
    time: torch.Tensor,
    feat: torch.Tensor | None,
    ranges: list[tuple[int, int]],
) -> None:
    """Applies events ``[begin, end)`` of each of ``ranges``, in order, to ``memory``.

    Args:
        model: whose GRU updates the memory (its weights as they are).
        memory: the copy, moved forward in place.
        src, dst: int64 [E] endpoints of the whole stream; time: float64 [E]; feat: float32 [E, d_e] or None.
        ranges: consecutive event ranges (training batches' size).
    """
    for begin, end in ranges:
        chunk_src, chunk_dst = src[begin:end], dst[begin:end]
        nodes, inverse = torch.unique(torch.cat([chunk_src, chunk_dst]), return_inverse=True)
        rows = model.read_memory(memory, nodes)
        memory.write_memory(nodes, rows)
        count = end - begin
        chunk_feat = None if feat is None else feat[begin:end]
        memory.store_mail(
            chunk_src, chunk_dst, time[begin:end], rows[inverse[:count]], rows[inverse[count:]], chunk_feat
        )


@dataclass(frozen=True)
class _Chunk:
    """One chunk's slices of the flat index arrays: its memory reads ``[read, read_end)`` and its mail writes
    ``[mail, mail_end)``."""

    read: int
    read_end: int
    mail: int
    mail_end: int


@dataclass(frozen=True)
class _Window:
    """Consecutive chunks whose reads ``[read, read_end)`` get their time encodings in one call."""

    read: int
    read_end: int
    chunks: list[_Chunk]


class StreamReplay:
    """The replay of events ``[0, stop)`` in chunks of ``batch_size`` into an emptied memory.

    Args:
        src, dst: int64 [E] endpoints of the whole stream on ``device``; time: float64 [E]; feat: float32
            [E, d_e] or None (the tensors the runner holds; read, never written).
        stop: the first event not replayed (> 0).
        batch_size: the chunk size (the training batch's).
        device: where the memory lives; on a GPU the replay is captured in a CUDA graph at its first call.

    ``replay(model, memory)`` empties ``memory`` and applies the events with ``model``'s GRU as its weights
    stand: the memory :func:`replay_memory` of the same chunks leaves in an emptied memory, up to the order of
    float additions. The graph holds ``memory``'s tensors (and ``model``'s): a call with another memory runs
    eagerly again and captures anew.
    The plan keeps up to 96 bytes per replayed event on the device (indices and times of the reads and mail).
    """

    def __init__(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        time: torch.Tensor,
        feat: torch.Tensor | None,
        stop: int,
        batch_size: int,
        device: torch.device,
    ) -> None:
        if not 0 < stop <= len(src) or batch_size < 1:
            raise ConfigError(
                f"a replay covers events [0, stop) of {len(src)} in chunks >= 1, got {stop}, {batch_size}"
            )
        self.stop, self.batch_size, self.device, self.feat = stop, batch_size, device, feat
        host = [tensor[:stop].cpu().numpy() for tensor in (src, dst, time)]
        arrays, chunks = _plan(*host, batch_size)
        self.windows = _windows(chunks)
        self.pending, self.since, self.ends, self.pairs, self.events, self.nodes, self.updated, self.mailed = (
            torch.from_numpy(array).to(device) for array in arrays
        )
        self._graph: torch.cuda.CUDAGraph | None = None
        self._memory: NodeMemory | None = None  # the memory whose tensors the graph holds (or the eager run used)

    @property
    def num_reads(self) -> int:
        """Memory reads through the GRU over the whole replay."""
        return len(self.pending)

    @property
    def num_chunks(self) -> int:
        return sum(len(window.chunks) for window in self.windows)

    @torch.no_grad()
    def replay(self, model: TGN, memory: NodeMemory, graph: bool = True) -> None:
        """Empties ``memory`` and replays the events into it; on a GPU with ``graph``: at the first call with this
        memory eagerly, then captured (not run again), and from the captured graph at every call after; without
        ``graph`` eagerly."""
        if self.device.type != "cuda" or not graph:
            self._apply(model, memory)
            return
        if memory is not self._memory or self._graph is None:
            self._graph, self._memory = None, None
            self._eager(model, memory)
            captured = torch.cuda.CUDAGraph()
            capture(captured, lambda: self._apply(model, memory), self.device)
            self._graph, self._memory = captured, memory
            log.info("memory replay of %d events (%d chunks) captured in a CUDA graph", self.stop, self.num_chunks)
            return
        self._graph.replay()

    def _eager(self, model: TGN, memory: NodeMemory) -> None:
        """A run on a side stream, as a capture wants before it (cuBLAS's handles and workspaces made)."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._apply(model, memory)
        current.wait_stream(side)

    def _apply(self, model: TGN, memory: NodeMemory) -> None:
        memory.reset()
        gru, encode = model.updater.gru, model.updater.time
        width = 2 * memory.memory_dim
        for window in self.windows:
            encoded = encode(self.since[window.read : window.read_end])
            for chunk in window.chunks:
                if chunk.read_end > chunk.read:
                    pending = self.pending[chunk.read : chunk.read_end]
                    encoding = encoded[chunk.read - window.read : chunk.read_end - window.read]
                    inputs = torch.cat([memory.mail.index_select(0, pending), encoding], 1)
                    memory.memory.index_copy_(0, pending, gru(inputs, memory.memory.index_select(0, pending)))
                # Each node's last event of the chunk: its own memory, the other endpoint's, the event's features.
                message = memory.memory.index_select(0, self.pairs[2 * chunk.mail : 2 * chunk.mail_end]).view(-1, width)
                if self.feat is not None:
                    event_feat = self.feat.index_select(0, self.events[chunk.mail : chunk.mail_end])
                    message = torch.cat([message, event_feat], 1)
                memory.mail.index_copy_(0, self.ends[chunk.mail : chunk.mail_end], message)
        memory.last_update.index_copy_(0, self.nodes, self.updated)
        memory.mail_time.index_copy_(0, self.nodes, self.mailed)
        memory.has_mail.index_fill_(0, self.nodes, True)


def _plan(src: np.ndarray, dst: np.ndarray, time: np.ndarray, batch_size: int) -> tuple[list[np.ndarray], list[_Chunk]]:
    """What a replay of ``src``/``dst``/``time`` from an empty memory does, chunk by chunk, found from the events
    alone: from an empty memory a chunk's endpoint has mail to apply iff it was an endpoint before, its memory
    is zero otherwise, and every endpoint ends the chunk with mail from its last event (src before dst within an
    event). Returns the flat arrays [pending nodes, their time since the last update (float64), mail targets,
    (target, other endpoint) pairs, mail events, nodes seen, their last update and mail times] and the chunks'
    slices of them."""
    num_nodes = int(max(src.max(), dst.max())) + 1
    seen = np.zeros(num_nodes, dtype=bool)
    mail_time = np.zeros(num_nodes, dtype=np.float64)
    last_update = np.zeros(num_nodes, dtype=np.float64)
    pending, since, ends, pairs, events, chunks = [], [], [], [], [], []
    reads = mails = 0
    for begin in range(0, len(src), batch_size):
        end = min(begin + batch_size, len(src))
        chunk_src, chunk_dst = src[begin:end], dst[begin:end]
        nodes = np.unique(np.concatenate([chunk_src, chunk_dst]))
        read = nodes[seen[nodes]]
        pending.append(read)
        since.append(mail_time[read] - last_update[read])
        last_update[read] = mail_time[read]
        # Endpoints in event order, source before destination; the last entry of each node wins.
        order = np.stack([chunk_src, chunk_dst], 1).ravel()
        other = np.stack([chunk_dst, chunk_src], 1).ravel()
        targets, from_end = np.unique(order[::-1], return_index=True)
        last = len(order) - 1 - from_end
        ends.append(targets)
        pairs.append(np.stack([targets, other[last]], 1).ravel())
        events.append(begin + last // 2)
        mail_time[targets] = time[begin + last // 2]
        seen[targets] = True
        chunks.append(_Chunk(reads, reads + len(read), mails, mails + len(targets)))
        reads, mails = reads + len(read), mails + len(targets)
    nodes = np.flatnonzero(seen)
    arrays = [
        np.concatenate(pending).astype(np.int64),
        np.concatenate(since),
        np.concatenate(ends).astype(np.int64),
        np.concatenate(pairs).astype(np.int64),
        np.concatenate(events).astype(np.int64),
        nodes.astype(np.int64),
        last_update[nodes],
        mail_time[nodes],
    ]
    return arrays, chunks


def _windows(chunks: list[_Chunk]) -> list[_Window]:
    """The chunks grouped so that a window holds at most :data:`WINDOW_READS` reads (or one chunk)."""
    windows: list[_Window] = []
    group: list[_Chunk] = []
    for chunk in chunks:
        if group and chunk.read_end - group[0].read > WINDOW_READS:
            windows.append(_Window(group[0].read, group[-1].read_end, group))
            group = []
        group.append(chunk)
    windows.append(_Window(group[0].read, group[-1].read_end, group))
    return windows
