"""ReLU followed by (inverted) dropout, fused into one pass on the CPU and on a GPU.

``relu_dropout(x, p, training)`` equals ``F.dropout(F.relu(x), p, training)`` in
distribution. On the CPU with float32 it runs the C++ kernel of
``csrc/cpu/nn_ops.cpp``: the keep/drop draw of element ``i`` is 16 bits of a
counter-based hash of ``(rng_seed, i)`` (``rng_seed`` drawn from torch's
default generator, so ``torch.manual_seed`` fixes the masks), and the backward
needs only the output (``grad * scale`` where the output is positive). torch's
``bernoulli_`` draws one Mersenne-Twister double per element and made dropout a
quarter of a GraphSAGE step on the CPU. On a GPU with float32 it runs the CUDA
kernels of ``csrc/cuda/relu_dropout.cu`` (the ``nn`` extension,
:func:`distgnn.native.cuda.nn_kernels`): the same hash of ``(seed, offset + i)``
with ``seed`` and ``offset`` from torch's CUDA generator (so ``torch.manual_seed``
fixes the masks and a CUDA graph draws new ones on every replay), one pass
forward and one backward instead of torch's four and a mask. Elsewhere (other
dtypes, or where that extension cannot be built, after one warning) it is the
torch composition. :func:`relu_dropout_reference` is both kernels in numpy.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from distgnn.native.cpu import extension
from distgnn.native.optional import OptionalExtension

_LEVELS = 1 << 16  # a 16-bit draw per element: p is rounded to a multiple of 1/65536


def relu_dropout_levels() -> int:
    """The kernels' draws per element are 16-bit: a threshold of this many drops everything."""
    return _LEVELS


class Dropped(NamedTuple):
    """``relu_dropout(rows, p, training)`` not applied yet: a model hands it to its next layer, which applies it
    fused with its aggregation where it can (:class:`~distgnn.nn.conv.SAGEConv`,
    :func:`~distgnn.nn.aggregate.relu_dropout_self_and_mean`) and calls :meth:`apply` otherwise."""

    rows: torch.Tensor
    p: float
    training: bool

    def apply(self) -> torch.Tensor:
        return relu_dropout(self.rows, self.p, self.training)


def drop_threshold(p: float) -> int:
    """Draws below this (out of 65536) drop their element; ``p`` rounded to the kernel's 16-bit grid."""
    return int(round(p * _LEVELS))


def relu_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``dropout(relu(x), p)`` when ``training``, else ``relu(x)``; gradients flow to ``x``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return F.relu(x)
    if x.dtype != torch.float32 or drop_threshold(p) >= _LEVELS:
        return F.dropout(F.relu(x), p, True)
    if x.device.type == "cpu":
        return _ReluDropout.apply(x, p)
    if x.is_cuda and _cuda_kernels() is not None:
        return _CudaReluDropout.apply(x, p)
    return F.dropout(F.relu(x), p, True)


def _load_nn_kernels() -> ModuleType:
    from distgnn.native.cuda import nn_kernels

    return nn_kernels()


# The CUDA nn extension.
_cuda_kernels = OptionalExtension("CUDA relu_dropout", _load_nn_kernels, "torch ops")


class _CudaReluDropout(torch.autograd.Function):
    """The CUDA kernels: one pass forward (draws from torch's CUDA generator), one pass backward from the output."""

    @staticmethod
    def forward(ctx, x, p):
        threshold = drop_threshold(p)
        scale = _LEVELS / (_LEVELS - threshold)
        out = _cuda_kernels().relu_dropout(x.detach().contiguous(), threshold, scale)
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        return _cuda_kernels().relu_dropout_backward(out, grad_out.contiguous(), ctx.scale), None


class _ReluDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        threshold = drop_threshold(p)
        scale = _LEVELS / (_LEVELS - threshold)
        rng_seed = int(torch.randint(0, 2**62, (1,)).item())
        x = x.detach().contiguous()
        out = torch.empty_like(x)
        extension().relu_dropout(
            x.view(-1).numpy(), out.view(-1).numpy(), threshold, scale, rng_seed, torch.get_num_threads()
        )
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_in = torch.empty_like(out)
        extension().relu_dropout_backward(
            out.view(-1).numpy(),
            grad_out.view(-1).numpy(),
            grad_in.view(-1).numpy(),
            ctx.scale,
            torch.get_num_threads(),
        )
        return grad_in, None


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def relu_dropout_reference(x: np.ndarray, threshold: int, scale: float, rng_seed: int, offset: int = 0) -> np.ndarray:
    """The kernels' output for a flat float32 ``x``: the same 16-bit draws, in numpy. Element ``i`` draws at
    counter ``offset + i`` (the CPU kernel's offset is 0; the CUDA kernel's comes from torch's generator)."""
    with np.errstate(over="ignore"):
        key = _mix64(np.array([rng_seed], dtype=np.uint64))[0]
        index = np.arange(x.shape[0], dtype=np.uint64) + np.uint64(offset)
        words = _mix64(key + (index >> np.uint64(2)) * np.uint64(0x9E3779B97F4A7C15))
    draws = (words >> (np.uint64(16) * (index & np.uint64(3)))) & np.uint64(0xFFFF)
    factor = np.where(draws >= np.uint64(threshold), np.float32(scale), np.float32(0))
    return (np.maximum(x, np.float32(0)) * factor).astype(np.float32)
