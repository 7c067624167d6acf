"""Message aggregation over a Block's CSC: the sparse kernels the layers share.

The torch versions run on any device. On the CPU, weighted sums go through a
CSR sparse-dense product (no ``(num_edges, F)`` message tensor is materialised;
on a GPU they gather the messages and ``index_add`` them, see :func:`weighted_sum`);
the attention softmax is a segment softmax over each destination's in-edges.
On the CPU, float32 means run in the C++ kernels of ``csrc/cpu/nn_ops.cpp``
(one pass over the edges, a scatter backward, the ``[self | mean]`` input of a
SAGE layer written in the same pass). On a GPU, float32, float16 and bfloat16
means run in the CUDA kernels of ``csrc/cuda/aggregate.cu`` (in the graph
extension, :func:`distgnn.native.cuda.graph_kernels`): a group of lanes per
destination, float32 sums, an atomic scatter backward (float32 atomics; half
gradients are accumulated in float32 and cast once, and the order of the adds
varies, so gradients are not bitwise reproducible; under
``torch.use_deterministic_algorithms(True)`` the torch versions run instead).
Where that extension cannot be built the torch versions run, after one
warning. :func:`mean_reference` and :func:`self_and_mean_reference` are the
torch versions both are tested against.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import torch
from torch.autograd.function import once_differentiable

from distgnn.native.cpu import extension
from distgnn.native.optional import OptionalExtension
from distgnn.nn.fused import drop_threshold, relu_dropout, relu_dropout_levels
from distgnn.sampling.block import Block


def in_degrees(block: Block) -> torch.Tensor:
    """``(num_dst,)`` int64 number of in-edges of each destination node."""
    return block.indptr[1:] - block.indptr[:-1]


def _csr(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():
        # torch flags CSR support as beta; we only rely on the CSR x dense product.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(indptr, indices, values, size=shape, check_invariants=False)


def _spmm(sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse.mm(sparse, dense)


class _WeightedSum(torch.autograd.Function):
    """CSR product with our own backward: torch's gradient for the values of a
    CSR operand assumes sorted column indices, which Block rows do not have."""

    @staticmethod
    def forward(ctx, indptr, indices, dst, weight, x):
        ctx.save_for_backward(indptr, indices, dst, weight, x)
        return _spmm(_csr(indptr, indices, weight, (indptr.shape[0] - 1, x.shape[0])), x)

    @staticmethod
    def backward(ctx, grad_out):
        indptr, indices, dst, weight, x = ctx.saved_tensors
        grad_weight = grad_x = None
        if ctx.needs_input_grad[3]:
            grad_weight = (grad_out[dst] * x[indices]).sum(1)
        if ctx.needs_input_grad[4]:
            # The transposed operator in CSR: edges sorted by source.
            order = torch.argsort(indices, stable=True)
            counts = torch.bincount(indices, minlength=x.shape[0])
            t_indptr = torch.zeros(x.shape[0] + 1, dtype=torch.int64, device=indptr.device)
            torch.cumsum(counts, 0, out=t_indptr[1:])
            transposed = _csr(t_indptr, dst[order], weight[order], (x.shape[0], grad_out.shape[0]))
            grad_x = _spmm(transposed, grad_out)
        return None, None, None, grad_weight, grad_x


def weighted_sum(
    block: Block, x: torch.Tensor, edge_weight: torch.Tensor, dst: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[d] = sum over in-edges e=(s, d) of edge_weight[e] * x[s]``.

    Args:
        x: ``(num_src, F)`` float source features.
        edge_weight: ``(num_edges,)`` float, same dtype as ``x``.
        dst: ``block.dst_index()`` where the caller already has it (computed here otherwise).
    Returns:
        ``(num_dst, F)``.
    """
    if block.num_edges == 0:
        return x.new_zeros((block.num_dst, x.shape[1]))
    dst = block.dst_index() if dst is None else dst
    if x.is_cuda:
        # torch's CUDA CSR product gives wrong rows for a strided values tensor (GAT's per-head view of its
        # attention weights; seen with torch 2.11 on an H100, tests/nn/test_aggregate_cuda.py): gather the
        # messages and index_add them, right whatever the weights' strides and the columns' order.
        messages = x[block.indices] * edge_weight[:, None]
        return x.new_zeros((block.num_dst, x.shape[1])).index_add_(0, dst, messages)
    return _WeightedSum.apply(block.indptr, block.indices, dst, edge_weight, x)


def mean(block: Block, x: torch.Tensor) -> torch.Tensor:
    """Mean of the in-neighbours' rows of ``x`` (``(num_src, F)``) per destination; 0 where none."""
    return _mean_op(block, x, with_self=False)


def self_and_mean(block: Block, x: torch.Tensor) -> torch.Tensor:
    """``(num_dst, 2F)``: each destination's own row of ``x`` (the first ``num_dst`` rows), then its neighbour mean.

    The input of a SAGE layer's single product with ``[W_self | W_neigh]``.
    """
    return _mean_op(block, x, with_self=True)


def _mean_op(block: Block, x: torch.Tensor, with_self: bool) -> torch.Tensor:
    """The mean op's one dispatch point (``with_self``: ``[x[:num_dst] | mean]``): the C++ kernel, the CUDA
    kernel, or the torch reference, by where ``x`` and the block lie and what the kernels take."""
    if _native(block, x):
        return _MeanAggregate.apply(block.indptr, block.indices, x, with_self)
    if _native_cuda(block, x):
        return _CudaMeanAggregate.apply(block.indptr, block.indices, x, with_self)
    return self_and_mean_reference(block, x) if with_self else mean_reference(block, x)


def relu_dropout_self_and_mean(block: Block, h: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """:func:`self_and_mean` of ``relu_dropout(h, p, training)`` (:func:`distgnn.nn.fused.relu_dropout`, the same
    masks for the same torch seed): a hidden layer's input. On the CPU with float32 in training, the forward is the
    two kernels, and the backward one C++ pass that gathers each row's gradient over its out-edges and applies
    the ReLU + dropout mask as it writes it (instead of a zero fill, a scatter and a masking pass over
    ``(num_src, F)``: 56k x 256 at a 1M-node GraphSAGE batch's second layer)."""
    if training and p > 0.0 and drop_threshold(p) < relu_dropout_levels() and _native(block, h):
        return _ReluDropoutMean.apply(block.indptr, block.indices, h, p)
    return self_and_mean(block, relu_dropout(h, p, training))


class _ReluDropoutMean(torch.autograd.Function):
    """``relu_dropout`` then the C++ ``[self | mean]``; the backward is ``relu_dropout_mean_backward``."""

    @staticmethod
    def forward(ctx, indptr, indices, h, p):
        dropped = relu_dropout(h.detach(), p, True)  # the C++ kernel, its seed drawn as always
        width = dropped.shape[1]
        out = dropped.new_empty((indptr.shape[0] - 1, 2 * width))
        extension().mean_aggregate(
            indptr.numpy(), indices.numpy(), dropped.numpy(), out.numpy(), width, 0, torch.get_num_threads()
        )
        ctx.save_for_backward(indptr, indices, dropped)
        ctx.scale = relu_dropout_levels() / (relu_dropout_levels() - drop_threshold(p))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[2]:
            return None, None, None, None
        indptr, indices, dropped = ctx.saved_tensors
        grad_h = torch.empty_like(dropped)
        extension().relu_dropout_mean_backward(
            indptr.numpy(),
            indices.numpy(),
            grad_out.contiguous().numpy(),
            dropped.numpy(),
            ctx.scale,
            grad_h.numpy(),
            torch.get_num_threads(),
        )
        return None, None, grad_h, None


def mean_reference(block: Block, x: torch.Tensor) -> torch.Tensor:
    """:func:`mean` in torch ops (any device and dtype)."""
    deg = in_degrees(block)
    inv = 1.0 / deg.clamp(min=1).to(x.dtype)
    return weighted_sum(block, x, torch.repeat_interleave(inv, deg, output_size=block.num_edges))


def self_and_mean_reference(block: Block, x: torch.Tensor) -> torch.Tensor:
    """:func:`self_and_mean` in torch ops (any device and dtype)."""
    return torch.cat([x[: block.num_dst], mean_reference(block, x)], dim=1)


def _native(block: Block, x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and block.indptr.device.type == "cpu"
        and block.indptr.dtype == torch.int64
        and block.indices.dtype == torch.int64
    )


class _MeanAggregate(torch.autograd.Function):
    """The C++ mean (``with_self``: ``[x[:num_dst] | mean]``) and its scatter backward."""

    @staticmethod
    def forward(ctx, indptr, indices, x, with_self):
        x = x.detach().contiguous()
        num_dst, width = indptr.shape[0] - 1, x.shape[1]
        out = x.new_empty((num_dst, 2 * width if with_self else width))
        layout = (width, 0) if with_self else (0, -1)  # (mean column, self column)
        extension().mean_aggregate(
            indptr.numpy(), indices.numpy(), x.numpy(), out.numpy(), *layout, torch.get_num_threads()
        )
        ctx.save_for_backward(indptr, indices)
        ctx.num_src, ctx.layout = x.shape[0], layout
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[2]:
            return None, None, None, None
        indptr, indices = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        width = grad_out.shape[1] // 2 if ctx.layout[1] >= 0 else grad_out.shape[1]
        grad_x = grad_out.new_empty((ctx.num_src, width))
        extension().mean_aggregate_backward(
            indptr.numpy(), indices.numpy(), grad_out.numpy(), *ctx.layout, grad_x.numpy(), torch.get_num_threads()
        )
        return None, None, grad_x, None


_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _native_cuda(block: Block, x: torch.Tensor) -> bool:
    # The kernels' backward adds with atomics (order varies): torch's deterministic mode takes the torch path.
    return (
        x.is_cuda
        and not torch.are_deterministic_algorithms_enabled()
        and x.dtype in _CUDA_DTYPES
        and x.dim() == 2
        and block.indptr.device == x.device
        and block.indices.device == x.device
        and block.indptr.dtype == torch.int64
        and block.indices.dtype in (torch.int32, torch.int64)
        and _cuda_extension() is not None
    )


def cuda_kernels_available() -> bool:
    """Whether the CUDA mean kernels can run here (the graph extension builds or is cached); builds it once."""
    return torch.cuda.is_available() and _cuda_extension() is not None


def _load_graph_kernels() -> ModuleType:
    from distgnn.native.cuda import graph_kernels

    return graph_kernels()


# The CUDA graph extension, which holds the mean kernels.
_cuda_extension = OptionalExtension("CUDA mean aggregation", _load_graph_kernels, "torch ops")


class _CudaMeanAggregate(torch.autograd.Function):
    """The CUDA mean (``with_self``: ``[x[:num_dst] | mean]``) and its atomic scatter backward, on the current stream."""

    @staticmethod
    def forward(ctx, indptr, indices, x, with_self):
        out = _cuda_extension().mean_aggregate(indptr, indices, x.detach().contiguous(), with_self)
        ctx.save_for_backward(indptr, indices)
        ctx.num_src, ctx.with_self = x.shape[0], with_self
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[2]:
            return None, None, None, None
        indptr, indices = ctx.saved_tensors
        grad_x = _cuda_extension().mean_aggregate_backward(
            indptr, indices, grad_out.contiguous(), ctx.num_src, ctx.with_self
        )
        return None, None, grad_x, None


def edge_softmax(block: Block, scores: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax of ``scores`` (``(num_edges, H)``) over each destination's in-edges (``dst`` as in :func:`weighted_sum`)."""
    if dst is None:
        dst = block.dst_index()
    heads = scores.shape[1]
    index = dst[:, None].expand(-1, heads)
    peak = scores.new_full((block.num_dst, heads), float("-inf"))
    peak = peak.scatter_reduce(0, index, scores.detach(), reduce="amax", include_self=True)
    exp = torch.exp(scores - peak[dst])
    total = scores.new_zeros((block.num_dst, heads)).index_add(0, dst, exp)
    return exp / total[dst]
