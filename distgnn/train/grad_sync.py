"""Dense gradients of several trainers kept in one flat buffer and averaged by one all-reduce, without DDP.

DDP's reducer hooks every parameter, buckets the gradients and all-reduces from inside autograd: none of that can
be captured in a CUDA graph. :class:`GradSync` is the plain version a captured step needs:

* the parameters are broadcast once from rank 0 (:func:`~distgnn.train.collective.broadcast_tensors`), so every trainer starts from the
  same weights;
* every parameter's ``.grad`` is a view of one flat buffer per dtype, made once: backward accumulates into it in
  place, :meth:`GradSync.zero_` clears it with one fill, :meth:`GradSync.all_reduce` averages it over the group
  with one collective per dtype; the addresses never change, so a CUDA graph can hold all three;
* :meth:`GradSync.agree_steps`, before the steps, tells every trainer the most steps any of them plans: one that
  has fewer batches adds steps on an empty batch (a zero gradient), so every trainer calls the all-reduce equally
  often; :func:`padded_epoch` (``TrainStep.epoch``, :meth:`EagerSync.epoch`) does the agreeing, counting and
  padding around one epoch's loop.

Never let an optimiser set the gradients to None (``zero_grad(set_to_none=True)``): the views would be lost;
:meth:`GradSync.attach` puts them back. Used by :class:`~distgnn.train.step.TrainStep` for a step captured across
GPUs; any job with dense parameters can use it the same way (NCCL on GPUs, gloo on CPUs). :class:`EagerSync` is the
eager step of the jobs that are not captured (R-GCN, link prediction): a GradSync on GPUs, DDP on CPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distgnn.errors import ConfigError, InputError
from distgnn.train.collective import broadcast_tensors


def _backend(group: dist.ProcessGroup | None, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors in ``group`` (``"cpu:gloo,cuda:nccl"`` names one per
    device type)."""
    name = str(dist.get_backend(group))
    for part in name.split(","):
        if ":" in part:
            kind, backend = part.split(":", 1)
            if kind == device.type:
                return backend
        else:
            return part
    return name


class GradSync:
    """The gradients of ``params`` as views of one flat buffer per dtype, averaged over ``group``.

    Args:
        params: the trainable parameters (all on one device); their values are broadcast from rank 0 here
            unless ``broadcast`` is False.
        group: the process group (None: the default group).
        broadcast: overwrite the parameters with rank 0's (collective) before taking the gradients' views.
        capturable: whether the all-reduce may be captured in a CUDA graph: None decides from the group's backend
            for the device (NCCL can; gloo cannot).

    Raises:
        ConfigError: torch.distributed is not initialised, no parameter needs a gradient, or the parameters lie on
            several devices.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        group: dist.ProcessGroup | None = None,
        broadcast: bool = True,
        capturable: bool | None = None,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("GradSync needs torch.distributed initialised (dist.init_process_group)")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ConfigError("GradSync got no parameter that requires a gradient")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ConfigError(f"GradSync needs every parameter on one device, got {sorted(map(str, devices))}")
        self.device = devices.pop()
        self.group = group
        self.world_size = dist.get_world_size(group)
        backend = _backend(group, self.device)
        self.capturable = (self.device.type == "cuda" and backend == "nccl") if capturable is None else capturable
        if broadcast:
            broadcast_tensors(self.params, 0, group)
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        sizes: dict[torch.dtype, int] = {}
        for p in self.params:
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
        for dtype, size in sizes.items():
            self.buffers[dtype] = torch.zeros(size, dtype=dtype, device=self.device)
        self._views: list[torch.Tensor] = []
        offsets = dict.fromkeys(sizes, 0)
        for p in self.params:
            start = offsets[p.dtype]
            self._views.append(self.buffers[p.dtype][start : start + p.numel()].view_as(p))
            offsets[p.dtype] = start + p.numel()
        self.attach()

    def attach(self) -> None:
        """Points every parameter's ``.grad`` at its view of the flat buffer (again, after a ``set_to_none``)."""
        for p, view in zip(self.params, self._views, strict=True):
            p.grad = view

    def attached(self) -> bool:
        """Whether every ``.grad`` is still its view of the flat buffer."""
        return all(
            p.grad is not None and p.grad.data_ptr() == v.data_ptr()
            for p, v in zip(self.params, self._views, strict=True)
        )

    def zero_(self) -> None:
        """Clears every gradient: one fill per dtype (capturable)."""
        for buffer in self.buffers.values():
            buffer.zero_()

    def all_reduce(self) -> None:
        """Averages the gradients over the group, in place: one all-reduce per dtype and a scale (capturable in a
        CUDA graph when :attr:`capturable`, after one eager call has set the communicator up). Collective."""
        if self.world_size == 1:
            return
        for buffer in self.buffers.values():
            dist.all_reduce(buffer, group=self.group)
            buffer.mul_(1.0 / self.world_size)

    def agree_steps(self, planned: int) -> int:
        """The most steps any trainer of the group plans (``planned``: this trainer's, e.g. its batches this
        epoch). Call it before the steps: a trainer that plans fewer adds the difference (steps with a zero
        gradient), so every trainer runs the all-reduce equally often. Collective (one small all-reduce on the
        parameters' device; it waits for it)."""
        if planned < 0:
            raise ConfigError(f"planned steps must be >= 0, got {planned}")
        most = torch.tensor([planned], dtype=torch.int64, device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        return int(most.item())


@contextlib.contextmanager
def padded_epoch(sync: Any, planned: int, *pad_args: Any) -> Iterator[int]:
    """One epoch of a trainer whose gradient all-reduce must run as often as every other trainer's::

        with step.epoch(books.batches_in(epoch)):   # TrainStep.epoch / EagerSync.epoch(planned, optimizer)
            for batch in batches:
                step(...)

    On entry the steps every trainer takes (``sync.agree_steps(planned)``, collective; yielded); on a normal exit
    ``sync.pad(missing, *pad_args)`` with the steps this trainer did not take (``sync.steps_taken`` counts its
    steps). An exception leaves without padding.

    Raises:
        InputError: the epoch took more steps than were agreed (the trainers' all-reduces would not pair up).
    """
    agreed = sync.agree_steps(planned)
    start = sync.steps_taken
    yield agreed
    taken = sync.steps_taken - start
    if taken > agreed:
        raise InputError(
            f"the epoch took {taken} steps, more than the {agreed} agreed with the other trainers (planned {planned})"
        )
    sync.pad(agreed - taken, *pad_args)


class EagerSync:
    """Eager training steps of one of several trainers, the dense gradients averaged after each backward.

    For jobs whose step cannot be captured in a CUDA graph (host-side sizes in the layers, sparse embeddings
    pulled from the servers): R-GCN over typed inputs, link prediction. Without ``ddp`` a
    :class:`GradSync` averages the dense parameters' gradients: no DDP wrapper, every gradient a view of one flat
    buffer, one all-reduce after backward (NCCL on GPUs). With ``ddp`` the model is wrapped in DDP. A single
    trainer takes the plain step. Parameters outside ``dense`` (embedding tables of a sparse optimizer) are
    neither averaged nor wrapped: their optimizer updates the servers' rows itself.

    Args:
        model: the module the loop calls; call :attr:`model` (the DDP wrapper where there is one).
        dense: the parameters the dense optimizer trains.
        distributed: one of several trainers of the default torch.distributed group. Collective: rank 0's dense
            weights are broadcast (DDP broadcasts every parameter).
        ddp: wrap in DDP instead; None: DDP on a CPU, a GradSync on a GPU.
        find_unused_parameters: DDP's (parameters some steps leave out; a GradSync gives them a zero gradient).

    Raises:
        ConfigError: ``distributed`` without an initialised torch.distributed, or no dense parameter.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        dense: Iterable[torch.nn.Parameter],
        distributed: bool,
        ddp: bool | None = None,
        find_unused_parameters: bool = False,
    ) -> None:
        self.dense = [p for p in dense if p.requires_grad]
        if not self.dense:
            raise ConfigError("EagerSync got no dense parameter that requires a gradient")
        device = self.dense[0].device
        self.model = model
        self.grad_sync: GradSync | None = None
        self.steps_taken = 0  # calls of step(), for epoch()
        if distributed and (device.type != "cuda" if ddp is None else ddp):
            ids = [device.index] if device.type == "cuda" else None
            self.model = DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused_parameters)
        elif distributed:
            self.grad_sync = GradSync(self.dense)

    def step(
        self,
        loss: torch.Tensor,
        optimizers: Sequence[torch.optim.Optimizer | Any],
        mark: Callable[[str], None] | None = None,
    ) -> None:
        """Clears every optimizer's gradients, backward from ``loss`` (``mark("backward")`` after it), averages
        the dense gradients over the trainers and steps every optimizer."""
        self.steps_taken += 1
        for optimizer in optimizers:
            optimizer.zero_grad()
        if self.grad_sync is not None:
            self.grad_sync.attach()  # zero_grad set the views to None
            self.grad_sync.zero_()
        loss.backward()
        if mark is not None:
            mark("backward")
        if self.grad_sync is not None:
            self.grad_sync.all_reduce()
        for optimizer in optimizers:
            optimizer.step()

    def agree_steps(self, planned: int) -> int:
        """The steps every trainer takes (``planned``: this trainer's): with a GradSync the most any trainer
        plans (collective), else ``planned``. A trainer that then took fewer calls :meth:`pad`."""
        return planned if self.grad_sync is None else self.grad_sync.agree_steps(planned)

    def epoch(self, planned: int, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[int]:
        """``with sync.epoch(planned, optimizer):`` around one epoch's steps: :meth:`agree_steps` on entry, then
        :meth:`pad` of the dense ``optimizer`` with the steps this trainer did not take (:func:`padded_epoch`)."""
        return padded_epoch(self, planned, optimizer)

    def pad(self, steps: int, optimizer: torch.optim.Optimizer) -> None:
        """``steps`` steps of the dense ``optimizer`` on a zero gradient, each with its all-reduce, so that this
        trainer averages as often as the others (:meth:`agree_steps`). Nothing without a GradSync."""
        if self.grad_sync is None:
            return
        for _ in range(steps):
            self.grad_sync.zero_()
            self.grad_sync.all_reduce()
            optimizer.step()
