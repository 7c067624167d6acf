"""One trainer's epoch over its plan's segments, and the evaluation of a trained model.

Every schedule minimises the same loss: the mean over the training span's snapshots of each snapshot's loss
(node regression: the MSE over its nodes; links: the binary cross-entropy of its next snapshot's edges against
as many uniform negatives), with the state reset at each window's start. A trainer adds up its share of that
loss (its segments, or its vertices of every segment), and the trainers' gradients are summed with one
all-reduce before the step (one step per epoch, as PyTorch Geometric Temporal's examples take).

The contiguous schedule's hand-off is differentiable: the receiving trainer returns the gradient of the state it
received, and the sender backpropagates it through its part of the window. The vertex schedule's gather is
too: its backward sums every trainer's gradient of the gathered rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distgnn.nn.recurrent import EvolveGCNO, SnapshotModel, SparseAdjacency, block_diagonal, normalized_adjacency
from distgnn.snapshot.schedule import Plan, Segment, make_windows
from distgnn.snapshot.sequence import DeviceSnapshot, Snapshot, SnapshotSequence, to_device
from distgnn.train.collective import all_gather_arrays

MRR_NEGATIVES = 20
# Windows of equal length run in lockstep as one disjoint union of their snapshots while their summed
# vertices + edges stay under this, by device type: small snapshots then cost one kernel per step, not one per
# window; on a CPU a smaller union keeps its activations in cache from one kernel to the next.
LOCKSTEP_COST = {"cpu": 20_000, "cuda": 2_000_000}


class _VertexGather(torch.autograd.Function):
    """Every trainer's rows -> all ``n`` rows (node ``v`` is row ``v // P`` of trainer ``v % P``)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, n: int, rank: int, world: int, comm: torch.device) -> torch.Tensor:
        ctx.rank, ctx.world, ctx.comm = rank, world, comm
        # Trainer r holds nodes r, r + world, ...: the counts are known, not exchanged.
        parts = all_gather_arrays(local.to(comm), counts=[len(range(r, n, world)) for r in range(world)])
        out = local.new_empty((n, local.shape[1]), device=comm)
        for r, part in enumerate(parts):
            out[r::world] = part
        return out.to(local.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        summed = grad.to(ctx.comm).contiguous()
        dist.all_reduce(summed)
        return summed[ctx.rank :: ctx.world].to(grad.device), None, None, None, None


def vertex_gather(n: int, rank: int, world: int, comm: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gather of a snapshot of ``n`` nodes for trainer ``rank`` of ``world`` (vertex schedule), through
    tensors on ``comm`` (the device the process group's backend carries)."""
    return lambda local: _VertexGather.apply(local, n, rank, world, comm)


def vertex_share(snapshot: Snapshot, device: torch.device, rank: int, world: int) -> DeviceSnapshot:
    """Trainer ``rank``'s rows (nodes ``v % world == rank``) of ``snapshot``: features, targets and the rows of
    both adjacencies over all nodes (positives: the edges whose destination it holds)."""
    n = snapshot.num_nodes
    local_n = len(range(rank, n, world))
    shares = []
    for loops in (False, True):
        rows, cols, vals = normalized_adjacency(snapshot.edge_index, snapshot.edge_weight, n, self_loops=loops)
        mine = rows % world == rank
        shares.append(SparseAdjacency.from_coo(rows[mine] // world, cols[mine], vals[mine], n, device, local_n))
    y = None if snapshot.y is None else torch.from_numpy(snapshot.y[rank::world].copy()).to(device)
    return DeviceSnapshot(
        torch.from_numpy(np.ascontiguousarray(snapshot.x[rank::world], np.float32)).to(device),
        y,
        shares[0],
        shares[1],
        torch.from_numpy(snapshot.edge_index).to(device),
        n,
    )


class EpochPosition:
    """Where a loop of one step per epoch stands, in the form checkpoints keep a loader's position: after the
    step of epoch ``e``, ``{"epoch": e, "batch": 1}`` (a resumed loop starts at ``e + 1``)."""

    def __init__(self) -> None:
        self.epoch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": 1}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


@dataclass
class EpochResult:
    """A trainer's epoch: its share of the loss, the seconds it computed and the seconds it waited for a
    hand-off, and per segment (window index -> seconds) for measured-cost planning."""

    loss: float
    busy_s: float
    wait_s: float
    segment_s: dict[int, float]


class SnapshotRunner:
    """A trainer's view of a sequence: its snapshots on its device (moved once, when first used) and the
    loss of a segment.

    Args:
        model: the :class:`SnapshotModel` (the same initial weights on every trainer).
        sequence: the whole sequence (every trainer reads it; it moves only what its plan uses).
        num_train: snapshots (node task) or samples (link task: snapshot ``t`` predicts ``t + 1``'s edges)
            of the training span.
        device: where the tensors go.
        rank, world: this trainer among the job's (0 and 1 in a single process).
        seed: negative sampling for links depends on it, the epoch and the snapshot only.
        comm_device: where tensors go to cross processes (the device, or the CPU where the backend is gloo).
    """

    def __init__(
        self,
        model: SnapshotModel,
        sequence: SnapshotSequence,
        num_train: int,
        device: torch.device,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        comm_device: torch.device | None = None,
    ) -> None:
        self.model, self.sequence, self.num_train = model, sequence, num_train
        self.comm = comm_device or device
        self.device, self.rank, self.world, self.seed = device, rank, world, seed
        self._full: dict[int, DeviceSnapshot] = {}
        self._share: dict[int, DeviceSnapshot] = {}
        self._unions: dict[tuple[int, ...], DeviceSnapshot] = {}

    def snapshot(self, t: int, vertex_split: bool = False) -> DeviceSnapshot:
        if vertex_split and self.world > 1:
            if t not in self._share:
                self._share[t] = vertex_share(self.sequence[t], self.device, self.rank, self.world)
            return self._share[t]
        if t not in self._full:
            self._full[t] = to_device(self.sequence[t], self.device)
        return self._full[t]

    def union(self, ts: tuple[int, ...]) -> DeviceSnapshot:
        """Snapshots ``ts`` as one disjoint union (kept for the next epoch)."""
        if len(ts) == 1:
            return self.snapshot(ts[0])
        if ts not in self._unions:
            parts = [self.snapshot(t) for t in ts]
            offsets = np.cumsum([0] + [p.num_nodes for p in parts])
            self._unions[ts] = DeviceSnapshot(
                torch.cat([p.x for p in parts]),
                None if parts[0].y is None else torch.cat([p.y for p in parts]),
                block_diagonal([p.cheb for p in parts]),
                block_diagonal([p.gcn for p in parts]),
                torch.cat([p.edge_index + int(o) for p, o in zip(parts, offsets, strict=False)], dim=1),
                int(offsets[-1]),
            )
        return self._unions[ts]

    def lockstep_loss(self, starts: list[int], length: int, epoch: int) -> torch.Tensor:
        """This trainer's share of the training loss over the windows ``start .. start + length - 1`` for each
        of ``starts``, run side by side from zero states (the same loss as one window at a time).

        Step ``j`` is one disjoint union of the windows' ``j``-th snapshots, whatever their graphs; the cell's
        input convolutions, which do not read the state, are one product over every step's union at once.
        """
        state, before = None, None
        loss = torch.zeros((), device=self.device)
        evolving = isinstance(self.model.cell, EvolveGCNO)
        steps = [tuple(s + j for s in starts) for j in range(length)]
        unions = [self.union(ts) for ts in steps]
        gates = [None] * length
        if length > 1 and not evolving:
            stacked = self.union(tuple(t for ts in steps for t in ts))
            gates = self.model.cell.input_gates(stacked.x, stacked.cheb).split([u.num_nodes for u in unions])
        for ts, union, step_gates in zip(steps, unions, gates, strict=True):
            sizes = [self.sequence[t].num_nodes for t in ts]
            if state is not None and not evolving and sizes != before:
                state = _regroup(state, before, sizes)
            adj = union.gcn if evolving else union.cheb
            h, state = self.model.embedding(union.x, adj, state, gates=step_gates)
            out = self.model.readout(h)
            if self.model.task == "node":
                counts = torch.tensor(sizes, device=self.device)
                weight = torch.repeat_interleave(1.0 / counts.to(out.dtype), counts)
                loss = loss + (weight * (out - union.y) ** 2).sum()
            else:
                offset = 0
                for t, n in zip(ts, sizes, strict=True):
                    loss = loss + self._loss(t, self.snapshot(t), out[offset : offset + n], epoch)
                    offset += n
            before = sizes
        return loss / self.num_train

    def state_shape(self, t: int) -> tuple[int, ...]:
        """The shape of the state after snapshot ``t``."""
        like = torch.empty(0, device=self.device)
        return tuple(self.model.cell.initial_state(self.sequence[t].num_nodes, like).shape)

    def segment_loss(
        self, start: int, stop: int, state: torch.Tensor | None, epoch: int, vertex_split: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This trainer's share of the training loss over snapshots ``start .. stop - 1`` from ``state``
        (None: zero); returns (loss, last state)."""
        snaps = [self.snapshot(t, vertex_split) for t in range(start, stop)]
        if vertex_split and self.world > 1:
            loss = torch.zeros((), device=self.device)
            for t, s in zip(range(start, stop), snaps, strict=True):
                out, state = self.model([s], state, gather=vertex_gather(s.num_nodes, self.rank, self.world, self.comm))
                loss = loss + self._loss(t, s, out[0], epoch, vertex_split=True)
            return loss / self.num_train, state
        stacked = self.union(tuple(range(start, stop))) if stop - start > 1 else None
        outs, state = self.model(snaps, state, stacked=stacked)
        loss = sum(self._loss(t, s, o, epoch) for t, s, o in zip(range(start, stop), snaps, outs, strict=True))
        return loss / self.num_train, state

    def _loss(self, t: int, s: DeviceSnapshot, out: torch.Tensor, epoch: int, vertex_split: bool = False):
        if self.model.task == "node":
            return F.mse_loss(out, s.y, reduction="sum") / s.num_nodes
        pos = _next_edges(self.snapshot(t + 1).edge_index, s.num_nodes)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 10_007 + t)
        neg = torch.randint(0, s.num_nodes, (pos.shape[1],), generator=gen).to(self.device)
        scores_pos = self.model.head(out[pos[0]], out[pos[1]])
        scores_neg = self.model.head(out[pos[0]], out[neg])
        scores = torch.cat([scores_pos, scores_neg])
        labels = torch.cat([torch.ones_like(scores_pos), torch.zeros_like(scores_neg)])
        return F.binary_cross_entropy_with_logits(scores, labels) if len(scores) else scores.sum()


def _regroup(state: torch.Tensor, before: list[int], after: list[int]) -> torch.Tensor:
    """Side-by-side states of blocks of ``before`` rows -> blocks of ``after`` rows (new rows zero)."""
    starts = np.cumsum([0] + after[:-1])
    index = torch.from_numpy(np.concatenate([s + np.arange(n) for s, n in zip(starts, before, strict=True)]))
    return state.new_zeros(sum(after), state.shape[1]).index_copy(0, index.to(state.device), state)


def _next_edges(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """The next snapshot's edges between nodes that exist now."""
    keep = (edge_index[0] < n) & (edge_index[1] < n)
    return edge_index[:, keep]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(runner: SnapshotRunner, plan: Plan, epoch: int) -> EpochResult:
    """Forward and backward over trainer ``runner.rank``'s segments of ``plan``; the gradients are left in the
    model (not yet summed over trainers: :func:`all_reduce_gradients`)."""
    device, rank = runner.device, runner.rank
    busy = wait = 0.0
    total = 0.0
    per_segment: dict[int, float] = {}
    # (segment, its input state, its output state) awaiting the gradient from the next trainer.
    pending: list[tuple[Segment, torch.Tensor | None, torch.Tensor]] = []
    sends = []
    segments = plan.segments[rank]
    i = 0
    while i < len(segments):
        seg = segments[i]
        batch = _lockstep_batch(runner, plan, segments, i)
        if len(batch) > 1 or not (seg.sends or seg.receives or plan.vertex_split):
            t0 = time.perf_counter()
            loss = runner.lockstep_loss([s.start for s in batch], seg.stop - seg.start, epoch)
            loss.backward()
            _sync(device)
            spent = time.perf_counter() - t0
            busy += spent
            costs = np.array([runner.sequence.costs()[s.start : s.stop].sum() for s in batch], np.float64)
            for s, share in zip(batch, costs / costs.sum(), strict=True):
                per_segment[s.window] = per_segment.get(s.window, 0.0) + spent * share
            total += float(loss.detach())
            i += len(batch)
            continue
        i += 1
        state = None
        if seg.receives:
            t0 = time.perf_counter()
            state = torch.empty(runner.state_shape(seg.start - 1), device=runner.comm)
            dist.recv(state, rank - 1)
            state = state.to(device).requires_grad_()
            wait += time.perf_counter() - t0
        t0 = time.perf_counter()
        loss, out_state = runner.segment_loss(seg.start, seg.stop, state, epoch, plan.vertex_split)
        loss.backward(retain_graph=seg.sends)
        if seg.sends:
            _isend(out_state.detach().to(runner.comm).contiguous(), rank + 1, sends)
            pending.append((seg, state, out_state))
        elif seg.receives:
            _isend(_grad_of(state, runner.comm), rank - 1, sends)
        _sync(device)
        spent = time.perf_counter() - t0
        busy += spent
        per_segment[seg.window] = per_segment.get(seg.window, 0.0) + spent
        total += float(loss.detach())
    for seg, state, out_state in pending:
        t0 = time.perf_counter()
        grad = torch.empty(out_state.shape, device=runner.comm)
        dist.recv(grad, rank + 1)
        t1 = time.perf_counter()
        wait += t1 - t0
        out_state.backward(grad.to(device))
        if seg.receives:
            _isend(_grad_of(state, runner.comm), rank - 1, sends)
        _sync(device)
        busy += time.perf_counter() - t1
    for request, _ in sends:
        request.wait()
    return EpochResult(total, busy, wait, per_segment)


def _lockstep_batch(runner: SnapshotRunner, plan: Plan, segments: list[Segment], i: int) -> list[Segment]:
    """Segments ``i, i + 1, ...`` that can run side by side: none hands a state on, all have the same length,
    and their summed cost stays under the device's :data:`LOCKSTEP_COST` (at least segment ``i``)."""
    first = segments[i]
    if plan.vertex_split or first.sends or first.receives:
        return [first]
    costs = runner.sequence.costs()
    limit = LOCKSTEP_COST.get(runner.device.type, LOCKSTEP_COST["cuda"])
    batch, total = [first], costs[first.start : first.stop].sum()
    for seg in segments[i + 1 :]:
        cost = costs[seg.start : seg.stop].sum()
        if seg.sends or seg.receives or seg.stop - seg.start != first.stop - first.start:
            break
        if total + cost > limit:
            break
        batch.append(seg)
        total += cost
    return batch


def _isend(tensor: torch.Tensor, peer: int, sends: list) -> None:
    # The tensor stays referenced until its send completes.
    sends.append((dist.isend(tensor, peer), tensor))


def _grad_of(state: torch.Tensor, comm: torch.device) -> torch.Tensor:
    return (state.grad if state.grad is not None else torch.zeros_like(state)).to(comm).contiguous()


def all_reduce_gradients(model: torch.nn.Module, comm: torch.device) -> None:
    """Sum every parameter's gradient over the job's trainers, in one flat buffer on ``comm`` (a missing
    gradient counts as zero)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    params = list(model.parameters())
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    summed = flat.to(comm)
    dist.all_reduce(summed)
    flat = summed.to(flat.device)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


@torch.no_grad()
def evaluate(runner: SnapshotRunner, window: int, first: int, stop: int) -> dict[str, float]:
    """The model over samples ``0 .. stop - 1`` in windows of ``window`` (0: one), scored on ``first ..
    stop - 1``: ``{"mse": ...}`` for nodes, ``{"mrr": ..., "auc": ...}`` for links (MRR against
    ``MRR_NEGATIVES`` uniform negatives per positive, AUC against one)."""
    runner.model.eval()
    mse, rr, wins, count = [], [], [], 0
    gen = torch.Generator().manual_seed(runner.seed + 7)
    for w in make_windows(stop, window):
        if w.stop <= first:
            continue
        state = None
        for t in range(w.start, w.stop):
            s = runner.snapshot(t)
            (out,), state = runner.model([s], state)
            if t < first:
                continue
            if runner.model.task == "node":
                mse.append(float(F.mse_loss(out, s.y)))
                continue
            pos = _next_edges(runner.snapshot(t + 1).edge_index, s.num_nodes)
            if pos.shape[1] == 0:
                continue
            negs = torch.randint(0, s.num_nodes, (pos.shape[1], MRR_NEGATIVES), generator=gen).to(runner.device)
            p = runner.model.head(out[pos[0]], out[pos[1]])
            n = runner.model.head(out[pos[0]].repeat_interleave(MRR_NEGATIVES, 0), out[negs.reshape(-1)])
            n = n.view(-1, MRR_NEGATIVES)
            rank = 1 + (n > p[:, None]).sum(1) + 0.5 * (n == p[:, None]).sum(1)
            rr.append(float((1.0 / rank).sum()))
            wins.append(float((p > n[:, 0]).sum() + 0.5 * (p == n[:, 0]).sum()))
            count += pos.shape[1]
    runner.model.train()
    if runner.model.task == "node":
        return {"mse": float(np.mean(mse))}
    return {"mrr": sum(rr) / max(count, 1), "auc": sum(wins) / max(count, 1)}


def held_out_figures(runner: SnapshotRunner, window: int, num_train: int, num_val: int, stop: int) -> dict[str, float]:
    """:func:`evaluate`'s figures of the samples after the training span: ``val_*`` of the first ``num_val``
    (none when 0) and ``test_*`` of the rest up to ``stop - 1``."""
    spans = {"val": (num_train, num_train + num_val)} if num_val else {}
    spans["test"] = (num_train + num_val, stop)
    return {f"{split}_{k}": v for split, span in spans.items() for k, v in evaluate(runner, window, *span).items()}
