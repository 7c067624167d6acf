"""Learnable node (or edge) embeddings held by the servers, with sparse optimizers.

``DistEmbedding`` stores its table in a ``DistTensor``. Calling it pulls the rows
of a mini-batch as a leaf tensor that autograd fills with a gradient; the
optimizer then sums the gradients per id and sends only the touched rows'
updates: ``push(add)`` of the differences (SGD, Adagrad), or the summed
gradients to the owners' servers, which apply the Adam step themselves. Updates
from several trainers interleave on the owning main server row by row, as in
DistDGL (asynchronous sparse updates).

By default a step does not wait for the servers to acknowledge its writes
(``wait=False`` in ``distgnn.client.tensor``): the acknowledgements are collected when
this trainer next reads rows of the same table that could miss them (its next
lookup or step), at ``flush``, at a barrier or checkpoint, so a lookup after a
step always sees the step's update, and a write that failed is raised there,
naming the table and machine. ``async_push=False`` waits inside every step (the
reference path; both give the same embeddings).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from distgnn.client.context import DistContext
from distgnn.client.tensor import DistTensor
from distgnn.errors import InputError


class DistEmbedding:
    """A ``(num_embeddings, embedding_dim)`` float32 table partitioned like nodes (or edges).

    Args:
        num_embeddings: the graph's node count (``part_policy="node"``) or edge count.
        embedding_dim: width of a row.
        name: shared by every trainer; all trainers must create it with the same arguments.
        init, low, high: as ``DistTensor`` (default uniform in ``[-1, 1)``).
        part_policy: ``"node"`` or ``"edge"``.
        context: defaults to ``distgnn.initialize``'s.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        name: str,
        init: str = "uniform",
        low: float = -1.0,
        high: float = 1.0,
        part_policy: str = "node",
        context: DistContext | None = None,
    ):
        self.name = name
        self.weight = DistTensor(
            (num_embeddings, embedding_dim),
            torch.float32,
            name,
            init=init,
            low=low,
            high=high,
            part_policy=part_policy,
            context=context,
        )
        self._trace: list[tuple[torch.Tensor, torch.Tensor, bool]] = []  # (ids, rows, ids known unique)

    @property
    def embedding_dim(self) -> int:
        return self.weight.shape[1]

    def __call__(self, ids: Any, device: torch.device | str = "cpu") -> torch.Tensor:
        """Rows ``ids`` as a ``(len(ids), embedding_dim)`` tensor on ``device``; with autograd
        enabled it is recorded so that the next optimizer ``step`` applies its gradient."""
        return self.lookup_async(ids)(device)

    def lookup_async(self, ids: Any, unique: bool = False) -> Callable[..., torch.Tensor]:
        """Starts looking up rows ``ids`` (remote rows pulled in the background, see ``DistTensor.read_async``);
        calling the result with a device finishes the lookup as calling the embedding does. Start the lookups
        of several embeddings (and feature reads) before finishing any, and their round trips overlap.

        ``unique``: the caller guarantees that ``ids`` has no repeats (a block's source nodes): when it is a
        step's only lookup, the step sends its gradient as it is, without summing per id (a repeat is then
        refused by the servers)."""
        ids = torch.as_tensor(ids, dtype=torch.int64).cpu()
        pending = self.weight.read_async(ids)

        def finish(device: torch.device | str = "cpu") -> torch.Tensor:
            rows = pending.result().to(device)
            if torch.is_grad_enabled():
                rows.requires_grad_(True)
                self._trace.append((ids, rows, unique))
            return rows

        return finish

    def _gradients(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(unique ids, summed gradient per id)`` of the recorded lookups, and clear the record."""
        traced = [(ids, rows.grad, unique) for ids, rows, unique in self._trace if rows.grad is not None]
        self._trace.clear()
        if not traced:
            return None
        if len(traced) == 1 and traced[0][2]:
            return traced[0][0], traced[0][1].detach().cpu()
        ids = torch.cat([ids for ids, _, _ in traced])
        grads = torch.cat([grad.detach().cpu() for _, grad, _ in traced])
        unique, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(len(unique), grads.shape[1], dtype=grads.dtype).index_add_(0, inverse, grads)
        return unique, summed


class _SparseOptimizer(abc.ABC):
    """Args common to the sparse optimizers: ``embeddings``, ``lr``, and ``async_push``: push a step's updates
    without waiting for the servers' acknowledgements (see the module docstring); False waits in ``step``."""

    def __init__(self, embeddings: list[DistEmbedding], lr: float, async_push: bool = True):
        if lr <= 0:
            raise InputError(f"learning rate must be positive, got {lr}")
        if not embeddings:
            raise InputError("a sparse optimizer needs at least one DistEmbedding")
        self.embeddings = list(embeddings)
        self.lr = lr
        self.async_push = async_push
        self.state: dict[str, DistTensor] = {}  # per embedding name, the optimizer's per-row state (if any)

    def zero_grad(self) -> None:
        """Drop the gradients accumulated so far, as torch's ``zero_grad`` does: a lookup made before this
        call still gets the gradient of a later ``backward`` (so ``forward; zero_grad; backward; step``, the
        order DGL's examples use, applies that step)."""
        for emb in self.embeddings:
            for _, rows, _ in emb._trace:
                rows.grad = None

    def step(self) -> None:
        """Apply the gradients of every recorded lookup since the last step."""
        for emb in self.embeddings:
            found = emb._gradients()
            if found is not None:
                self._update(emb, *found)

    def flush(self) -> None:
        """Wait until every update of the steps so far is applied on the servers; raises the first that failed."""
        for emb in self.embeddings:
            emb.weight.flush()
        for state in self.state.values():
            state.flush()

    def _push(self, tensor: DistTensor, ids: torch.Tensor, delta: torch.Tensor) -> None:
        tensor.push(ids, delta, mode="add", wait=not self.async_push)

    @abc.abstractmethod
    def _update(self, emb: DistEmbedding, ids: torch.Tensor, grad: torch.Tensor) -> None:
        """Push the update of rows ``ids`` (unique) given their summed gradient."""


class SparseSGD(_SparseOptimizer):
    """``w[i] -= lr * g[i]`` for every touched row ``i`` (``g`` summed over the batch)."""

    def _update(self, emb: DistEmbedding, ids: torch.Tensor, grad: torch.Tensor) -> None:
        self._push(emb.weight, ids, -self.lr * grad)


class SparseAdagrad(_SparseOptimizer):
    """Adagrad on touched rows: ``s[i] += g[i]**2``, ``w[i] -= lr * g[i] / (sqrt(s[i]) + eps)``.

    The squared-gradient sums live in a DistTensor named ``<embedding name>.adagrad``; a step reads them,
    then pushes ``g[i]**2`` (as SparseAdam, concurrent trainers read the sums without a lock).
    """

    def __init__(self, embeddings: list[DistEmbedding], lr: float, eps: float = 1e-10, async_push: bool = True):
        super().__init__(embeddings, lr, async_push)
        self.eps = eps
        self.state = {
            emb.name: DistTensor(
                emb.weight.shape,
                torch.float32,
                f"{emb.name}.adagrad",
                init="zeros",
                part_policy=emb.weight.part_policy,
                context=emb.weight.context,
            )
            for emb in self.embeddings
        }

    def _update(self, emb: DistEmbedding, ids: torch.Tensor, grad: torch.Tensor) -> None:
        state = self.state[emb.name]
        squared = grad * grad
        std = (state[ids] + squared).sqrt_().add_(self.eps)
        self._push(state, ids, squared)
        self._push(emb.weight, ids, -self.lr * grad / std)


class SparseAdam(_SparseOptimizer):
    """Adam on touched rows, with a step count per row (rows are touched at different rates):
    ``m[i] = b1 m[i] + (1 - b1) g[i]``, ``v[i] = b2 v[i] + (1 - b2) g[i]**2``, ``t[i] += 1``,
    ``w[i] -= lr * m̂ / (sqrt(v̂) + eps)`` with ``m̂ = m[i] / (1 - b1**t[i])``, ``v̂ = v[i] / (1 - b2**t[i])``.

    The moments and the count of row ``i`` live side by side in one DistTensor ``<embedding name>.adam``,
    ``[m[i] | v[i] | t[i]]`` (``(N, 2 * D + 1)``). A step sends each owner of touched rows one ``adam_step``
    request with the rows' ids and summed gradients; the owner's main server (the one writer of its rows)
    updates the state and the weights together, one request at a time, so concurrent trainers never lose
    one another's steps and nothing is pulled (a step on the trainer took a state pull and two pushes, one
    round trip each, per owner). Read ``state`` after ``flush``: its writes are settled under the weights.
    """

    def __init__(
        self,
        embeddings: list[DistEmbedding],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        async_push: bool = True,
    ):
        super().__init__(embeddings, lr, async_push)
        if not all(0.0 <= b < 1.0 for b in betas):
            raise InputError(f"Adam betas must be in [0, 1), got {betas}")
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = eps
        self.state: dict[str, DistTensor] = {}
        for emb in self.embeddings:
            weight = emb.weight
            self.state[emb.name] = DistTensor(
                (weight.shape[0], 2 * weight.shape[1] + 1),
                torch.float32,
                f"{emb.name}.adam",
                init="zeros",
                part_policy=weight.part_policy,
                context=weight.context,
            )

    def _update(self, emb: DistEmbedding, ids: torch.Tensor, grad: torch.Tensor) -> None:
        fields = {
            "state": self.state[emb.name].name,
            "lr": float(self.lr),
            "beta1": self.betas[0],
            "beta2": self.betas[1],
            "eps": float(self.eps),
        }
        rows = np.ascontiguousarray(grad.numpy(), dtype=np.float32)
        emb.weight.send_rows("adam_step", fields, ids.numpy(), rows, wait=not self.async_push)
