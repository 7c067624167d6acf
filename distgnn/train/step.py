"""One training step of a node classifier on sampled Blocks: eager, or replayed from a CUDA graph.

A GraphSAGE step at products scale (3 layers, batch 1024) is some 60 small kernels: forward, cross-entropy,
backward, the fused Adam. Issued from Python through autograd they take longer on the host than on the GPU, so
the GPU waits for the host. ``TrainStep`` in ``"graph"`` mode captures the whole step once in a CUDA graph over
static buffers and then replays it: one launch per batch, after a dozen copies that put the batch into the
buffers.

The buffers are sized to the largest batch the sampler can make (:func:`block_capacities`: with fanout ``f`` a
destination has at most ``f`` in-edges, and a layer's sources are its destinations plus at most one new node per
edge), so no batch needs a new capture and nothing waits for the GPU to learn a size. A batch fills the leading
rows of each buffer; the rest is padding that cannot reach the loss:

* ``indptr`` past the batch's destinations repeats its edge count: padded destinations have no in-edges, and
  padded ``indices`` entries are never read;
* real edges point only at real sources, and the destinations come first among the sources in every layer, so
  the real rows of each layer's output depend only on real rows of its input (stale rows of the feature buffer
  only feed padded outputs);
* padded labels are ``IGNORE_INDEX``: the mean cross-entropy counts the real seeds alone, padded logits get a
  zero gradient, and so does every padded row below them, so the weight gradients are those of the unpadded batch
  (up to the order of float additions in the matrix products).

The loss and the number of right predictions come back as 0-d device tensors that the graph rewrites on each
replay (read them before the next step, in stream order, as :class:`~distgnn.train.epoch.EpochMeter` does).
Dropout draws from torch's CUDA generator, which advances on every replay: the masks differ from an eager run's,
so the loss curve matches in distribution, not bitwise (with dropout 0 it matches to float tolerance; see
``tests/train/test_step.py``). The graph needs the CUDA mean aggregation kernels (the torch fallback sizes its
edge lists with a host sync), a model built of :class:`~distgnn.nn.SAGEConv` or linear layers, bounded fanouts and
an optimiser made with ``capturable=True``. ``"auto"`` picks the graph wherever it can run and says why not
otherwise (INFO log).

Several trainers (``distributed=True``): in graph mode there is no DDP wrapper. A
:class:`~distgnn.train.grad_sync.GradSync` broadcasts rank 0's weights once and keeps every gradient a view of
one flat buffer; the captured step zeroes the buffer, runs forward and backward, all-reduces the buffer (NCCL,
captured after the eager warm-up steps have run it once on the same communicator) and steps the optimiser: one
replay per batch. Where the group's backend cannot be captured (gloo), two graphs replay around one eager
all-reduce. Every trainer must replay equally often: the loader gives every trainer the same number of batches,
and :meth:`TrainStep.epoch` (:meth:`TrainStep.agree_steps`, then :meth:`TrainStep.pad`) adds steps on an empty batch
(a zero gradient) where a trainer has fewer. In eager mode the model is wrapped in DDP (NCCL on GPUs, gloo on CPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import distgnn.nn.aggregate as aggregate
from distgnn.errors import ConfigError, InputError
from distgnn.nn.models import MLP, GraphSAGE
from distgnn.sampling.block import Block
from distgnn.train.grad_sync import GradSync, padded_epoch

log = logging.getLogger(__name__)

STEP_MODES = ("auto", "eager", "graph")
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: padded seeds
WARMUP_STEPS = 2  # eager steps on the buffers before the capture (cuBLAS handles, the optimiser's state)


def add_step_args(parser: argparse.ArgumentParser) -> None:
    """``--step {auto,eager,graph}``: how each training step is issued on a GPU (``--matmul-precision`` is a
    job flag, :func:`distgnn.train.job.add_job_args`)."""
    parser.add_argument(
        "--step",
        default="auto",
        choices=STEP_MODES,
        help="graph: replay forward, backward, the gradient all-reduce of several GPUs and the optimiser from one "
        "CUDA graph per batch (GraphSAGE or MLP, bounded fanouts); eager: launch each op (DDP across trainers); "
        "auto: graph where it can run",
    )


def block_capacities(batch_size: int, fanouts: Sequence[int]) -> list[tuple[int, int, int]]:
    """The largest ``(num_src, num_dst, num_edges)`` of each layer's Block (input layer first) that a neighbour
    sampler with these fanouts can return for ``batch_size`` seeds.

    Raises:
        ConfigError: a fanout is not positive (-1, all neighbours, has no bound).
    """
    if batch_size < 1 or any(f < 1 for f in fanouts):
        raise ConfigError(
            f"a CUDA graph step needs batch_size >= 1 and every fanout >= 1 (sizes bounded ahead), got "
            f"batch_size {batch_size} and fanouts {list(fanouts)}; pass --step eager"
        )
    dst, caps = batch_size, []
    for fanout in reversed(fanouts):
        edges = dst * fanout
        caps.append((dst + edges, dst, edges))
        dst += edges
    return caps[::-1]


def graph_unsupported(model: torch.nn.Module, fanouts: Sequence[int], device: torch.device) -> str | None:
    """Why a CUDA graph step cannot run here, or None when it can."""
    if torch.device(device).type != "cuda":
        return f"the device is {device}, not a GPU"
    if isinstance(model, DistributedDataParallel):
        return "the model is DDP-wrapped (pass the bare module and distributed=True: the step syncs gradients itself)"
    if not isinstance(model, (GraphSAGE, MLP)):
        return f"{type(model).__name__} sizes its edge lists on the host (only GraphSAGE and MLP are captured)"
    if any(f < 1 for f in fanouts):
        return f"fanouts {list(fanouts)} include -1 (all neighbours): no bound on a batch's size"
    if isinstance(model, GraphSAGE) and not aggregate.cuda_kernels_available():
        return "the CUDA mean aggregation extension is not available"
    if torch.are_deterministic_algorithms_enabled():
        return "torch's deterministic mode takes the torch aggregation, which syncs"
    return None


def copy_padded(blocks: Sequence[Block], y: torch.Tensor, buffers: Sequence[Block], labels: torch.Tensor) -> None:
    """Puts a batch's CSCs and labels into the leading entries of the step's buffers and pads the rest: ``indptr``
    past the batch's destinations repeats its edge count, labels past its seeds are ``IGNORE_INDEX``. One
    foreach copy and a fill (launched from C++, not a dozen calls from Python: on the GPU the step waits for them).

    Args:
        blocks: the batch's Blocks; ``y``: its ``(num_seeds,)`` labels.
        buffers: Blocks of the capacities (``indptr`` ``(cap_dst + 1,)``, ``indices`` ``(cap_edges,)``), each at
            least as large as its block; ``labels``: ``(cap_seeds,)``, same dtype as ``y``.
    """
    dsts, srcs = [], []
    for block, buf in zip(blocks, buffers, strict=True):
        dst, edges = block.num_dst, block.num_edges
        dsts += [buf.indptr[: dst + 1], buf.indptr[dst + 1 :], buf.indices[:edges]]
        srcs += [block.indptr, block.indptr[dst:].expand(buf.num_dst - dst), block.indices]
    dsts.append(labels[: y.shape[0]])
    srcs.append(y)
    pairs = [(d, s) for d, s in zip(dsts, srcs, strict=True) if d.numel()]
    torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
    labels[y.shape[0] :].fill_(IGNORE_INDEX)


class TrainStep:
    """Forward, cross-entropy, backward and optimiser step of one batch.

    Args:
        model: maps ``(blocks, x)`` to ``(num_seeds, num_classes)`` logits.
        mode: ``"eager"``, ``"graph"`` (raises ConfigError where it cannot run) or ``"auto"``.
        batch_size, fanouts: the sampler's, to size the graph's buffers (:func:`block_capacities`).
        device: the training device.
        optimizer: set here or later (``step.optimizer = ...``), before the first call; in graph mode made with
            ``capturable=True`` over :attr:`model`'s parameters.
        distributed: one of several trainers of the default torch.distributed group: in graph mode the step
            averages the gradients itself (:class:`~distgnn.train.grad_sync.GradSync`, rank 0's weights broadcast
            here), in eager mode :attr:`model` is the module wrapped in DDP. Collective.

    Call it with a batch's Blocks (input layer first), ``x`` ``(num_src_0, F)`` float features and ``y``
    ``(num_seeds,)`` int64 labels on the device; it returns ``(loss, correct)``: the mean loss (0-d float) and
    the number of right argmax predictions (0-d int64), on the device.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        mode: str,
        batch_size: int,
        fanouts: Sequence[int],
        device: torch.device,
        optimizer: torch.optim.Optimizer | None = None,
        distributed: bool = False,
    ) -> None:
        if mode not in STEP_MODES:
            raise ConfigError(f"step mode must be one of {STEP_MODES}, got {mode!r}")
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        why_not = graph_unsupported(model, fanouts, self.device) if mode != "eager" else None
        if mode == "graph" and why_not:
            raise ConfigError(f"--step graph cannot run: {why_not}; pass --step eager or --step auto")
        if mode == "auto" and why_not:
            log.info("training step runs eagerly: %s", why_not)
        self.mode = "eager" if mode == "eager" or why_not else "graph"
        self.grad_sync: GradSync | None = None
        if distributed and self.graphed:
            self.grad_sync = GradSync(model.parameters())
        elif distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(model, device_ids=ids)
        self._capacities = block_capacities(batch_size, fanouts) if self.graphed else []
        self._x: torch.Tensor | None = None  # (capacity of layer 0's sources, F) input features
        self._buffers: tuple[list[Block], torch.Tensor] | None = None  # the blocks' CSCs and the labels
        self._graph: torch.cuda.CUDAGraph | None = None
        self._update_graph: torch.cuda.CUDAGraph | None = None  # the optimiser's, when the all-reduce stays eager
        self._outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._warmups = 0
        self.steps_taken = 0  # calls with a batch, for epoch()

    @property
    def graphed(self) -> bool:
        """Whether steps replay a CUDA graph."""
        return self.mode == "graph"

    @property
    def captured(self) -> bool:
        """Whether the graph has been captured (after :data:`WARMUP_STEPS` eager steps on the buffers)."""
        return self._graph is not None

    def input_rows(self, num_rows: int, width: int, dtype: torch.dtype) -> torch.Tensor | None:
        """In graph mode, the leading ``num_rows`` rows of the graph's input buffer, for the feature gather to
        write into (then the step copies nothing; :meth:`~distgnn.cache.feature_path.FeaturePath.inputs` takes
        this as ``rows``); None in eager mode, over the bound or for another width or dtype. The rows are
        overwritten by the next batch's gather, in stream order."""
        if not self.graphed or num_rows > self._capacities[0][0]:
            return None
        if self._x is None:
            self._x = torch.zeros((self._capacities[0][0], width), dtype=dtype, device=self.device)
        if self._x.shape[1] != width or self._x.dtype != dtype:
            return None
        return self._x[:num_rows]

    def __call__(
        self,
        blocks: Sequence[Block],
        x: torch.Tensor,
        y: torch.Tensor,
        mark: Callable[[str], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step; returns the loss and the number of right predictions (0-d device tensors).

        ``mark`` (an :meth:`~distgnn.train.epoch.EpochMeter.mark`) is told where the eager step's forward and
        backward end, for the epoch's stage split; a replayed graph is one launch and has no stages to mark.
        """
        if self.optimizer is None:
            raise ConfigError("TrainStep has no optimizer: set step.optimizer before the first step")
        self.steps_taken += 1
        if not self.graphed:
            logits = self.model(blocks, x)
            loss = F.cross_entropy(logits, y)
            if mark is not None:
                mark("forward")
            self.optimizer.zero_grad()
            loss.backward()
            if mark is not None:
                mark("backward")
            self.optimizer.step()
            return loss, (logits.argmax(1) == y).sum()
        self._load(blocks, x, y)
        return self._run()

    def epoch(self, planned: int) -> contextlib.AbstractContextManager[int]:
        """``with step.epoch(planned):`` around one epoch's steps (``planned``: this trainer's batches):
        :meth:`agree_steps` on entry, :meth:`pad` with the steps not taken on exit
        (:func:`~distgnn.train.grad_sync.padded_epoch`); nothing to pad with one trainer or DDP."""
        return padded_epoch(self, planned)

    def agree_steps(self, planned: int) -> int:
        """The steps every trainer takes, before they start (``planned``: this trainer's batches, e.g. in this
        epoch): across trainers whose graph holds the gradient all-reduce the most any of them plans (collective),
        else ``planned``. A trainer that then took fewer calls :meth:`pad` with the difference."""
        return planned if self.grad_sync is None else self.grad_sync.agree_steps(planned)

    def pad(self, steps: int) -> None:
        """Takes ``steps`` steps on an empty batch (zero loss and gradient; the optimiser applies the others'
        average), so that this trainer runs the all-reduce as often as the others (:meth:`agree_steps`).
        Does nothing without a :class:`~distgnn.train.grad_sync.GradSync` (one process, or DDP's eager step,
        whose trainers get equal batch counts from the loader)."""
        if self.grad_sync is None:
            return
        if steps and self._buffers is None:
            raise ConfigError(f"pad({steps}) before the first batch: the step's buffers are not sized yet")
        for _ in range(steps):
            block_bufs, y_buf = self._buffers
            for buf in block_bufs:
                buf.indptr.zero_()  # no edges, and no label that counts: zero loss, zero gradient
            y_buf.fill_(IGNORE_INDEX)
            self._run()

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The step on what the buffers hold: a warm-up, the capture, or a replay."""
        if self._graph is not None:
            self._replay()
            return self._outputs
        if self._warmups < WARMUP_STEPS:
            return self._warmup()
        self._capture()
        self._replay()
        return self._outputs

    def _replay(self) -> None:
        self._graph.replay()
        if self._update_graph is not None:
            self.grad_sync.all_reduce()
            self._update_graph.replay()

    def _load(self, blocks: Sequence[Block], x: torch.Tensor, y: torch.Tensor) -> None:
        """Copies the batch into the leading rows of the static buffers (made at the first batch) and pads."""
        if len(blocks) != len(self._capacities):
            raise InputError(f"got {len(blocks)} blocks for a step sized for {len(self._capacities)} layers")
        for layer, (block, (src_cap, dst_cap, edge_cap)) in enumerate(zip(blocks, self._capacities, strict=True)):
            if block.num_src > src_cap or block.num_dst > dst_cap or block.num_edges > edge_cap:
                raise InputError(
                    f"layer {layer}'s block has {block.num_src} sources, {block.num_dst} destinations and "
                    f"{block.num_edges} edges, over the CUDA graph's bound ({src_cap}, {dst_cap}, {edge_cap}) from "
                    "the batch size and fanouts; sample with the fanouts the step was made with, or --step eager"
                )
        if x.shape[0] != blocks[0].num_src or y.shape[0] != blocks[-1].num_dst:
            raise InputError(
                f"x has {x.shape[0]} rows and y {y.shape[0]}, the blocks {blocks[0].num_src} inputs and "
                f"{blocks[-1].num_dst} seeds"
            )
        if self._x is None:
            self._x = torch.zeros((self._capacities[0][0], x.shape[1]), dtype=x.dtype, device=self.device)
        if self._x.shape[1] != x.shape[1]:
            raise InputError(f"x has {x.shape[1]} columns, the step's earlier batches {self._x.shape[1]}")
        if self._buffers is None:
            self._buffers = self._allocate(blocks, y)
        block_bufs, y_buf = self._buffers
        if x.data_ptr() != self._x.data_ptr() or x.dtype != self._x.dtype:  # else gathered in place
            self._x[: x.shape[0]].copy_(x)
        copy_padded(blocks, y, block_bufs, y_buf)

    def _allocate(self, blocks: Sequence[Block], y: torch.Tensor) -> tuple[list[Block], torch.Tensor]:
        """Zeroed CSC buffers of the capacities and padded labels, in the first batch's dtypes."""
        device = self.device
        block_bufs = []
        for block, (src_cap, dst_cap, edge_cap) in zip(blocks, self._capacities, strict=True):
            block_bufs.append(
                Block(
                    # The layers read only num_src from the source ids: a broadcast view holds no memory.
                    src_nids=torch.zeros((), dtype=torch.int64, device=device).expand(src_cap),
                    num_dst=dst_cap,
                    indptr=torch.zeros(dst_cap + 1, dtype=torch.int64, device=device),
                    indices=torch.zeros(edge_cap, dtype=block.indices.dtype, device=device),
                    eids=torch.empty(0, dtype=torch.int64, device=device),
                )
            )
        y_buf = torch.full((self._capacities[-1][1],), IGNORE_INDEX, dtype=y.dtype, device=device)
        return block_bufs, y_buf

    def _forward_backward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward over the static buffers (the gradients zeroed first where they are a flat
        buffer's views); the loss is the mean over the real seeds, 0 for a batch of none."""
        block_bufs, y_buf = self._buffers
        if self.grad_sync is not None:
            self.grad_sync.zero_()
        logits = self.model(block_bufs, self._x)
        seeds = (y_buf != IGNORE_INDEX).sum().clamp(min=1)
        loss = F.cross_entropy(logits, y_buf, ignore_index=IGNORE_INDEX, reduction="sum") / seeds
        loss.backward()
        return loss.detach(), (logits.argmax(1) == y_buf).sum()

    def _on_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step over the static buffers: what the graph holds."""
        outputs = self._forward_backward()
        if self.grad_sync is not None:
            self.grad_sync.all_reduce()
        self.optimizer.step()
        return outputs

    def _warmup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A real step, eager on a side stream over the buffers (as torch's whole-network capture asks)."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        if self.grad_sync is None:
            self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.stream(side), warnings.catch_warnings():
            # The capturable optimiser warns when it runs outside a capture: here it must, once or twice.
            warnings.filterwarnings("ignore", message=".*capturable=True.*", category=UserWarning)
            loss, correct = self._on_buffers()
        current.wait_stream(side)
        for t in (loss, correct):
            t.record_stream(current)
        self._warmups += 1
        return loss, correct

    def _capture(self) -> None:
        """Captures the step (nothing runs until the replay): one graph, or two around an eager all-reduce where
        the group's backend cannot be captured. Without a GradSync the gradients then live in the graph's pool."""
        if self.grad_sync is None:
            self.optimizer.zero_grad(set_to_none=True)
        elif not self.grad_sync.attached():
            raise ConfigError("the gradients are no longer views of GradSync's buffer (zero_grad(set_to_none=True)?)")
        self._graph = torch.cuda.CUDAGraph()
        whole = self.grad_sync is None or self.grad_sync.capturable
        # thread_local: a sampling thread keeps using the GPU (its own stream) while this thread captures.
        with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):
            self._outputs = self._on_buffers() if whole else self._forward_backward()
        if not whole:
            self._update_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._update_graph, pool=self._graph.pool(), capture_error_mode="thread_local"):
                self.optimizer.step()
        log.info(
            "training step captured in %s; buffers sized (src, dst, edges) %s",
            "a CUDA graph" if whole else "two CUDA graphs around the eager gradient all-reduce",
            self._capacities,
        )
