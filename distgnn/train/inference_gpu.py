"""Layer-wise inference held on one GPU: every layer's output for all nodes stays in device memory.

:func:`distgnn.train.inference.layerwise_inference` moves each batch's inputs to the device and its outputs back to
a node tensor in host memory (or on the servers), and samples full neighbourhoods on the CPU. When one
trainer computes every node (one GPU, one machine) and a layer's output fits in GPU memory, all of that can
stay on the GPU: the GPU sampler builds the full-neighbour blocks of large batches of consecutive ids, the
inputs are read by device ids (through a :class:`~distgnn.cache.dist_feature.CachedFeature` or from a device
tensor), and each batch's output is written straight into its rows of the next layer's input buffer.

A GraphSAGE layer (mean aggregation) whose input is a whole tensor on the device samples nothing at all: the
graph's CSC (``g.replicated_structure()``) is placed on the device once, a batch of consecutive destinations is a
slice of it whose indices are global ids, and the mean kernel reads the neighbours' rows straight from the
previous layer's output; the layer gets ``[x_dst | mean]`` (:class:`~distgnn.sampling.block.SelfAndMean`). No
relabel, no gather of the sources' rows, no host sync per batch. Input features held elsewhere (a cache, a
DistTensor) are first read onto the device whole for a GraphSAGE model (``num_nodes * F * 4`` bytes). Other
layers (GAT) take the sampled full-neighbour blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from distgnn.errors import InputError
from distgnn.nn import aggregate
from distgnn.nn.conv import SAGEConv
from distgnn.sampling.block import Block, SelfAndMean
from distgnn.sampling.neighbor import NeighborSampler


def layerwise_inference_on_device(
    model: torch.nn.Module, g: Any, features: Any, batch_size: int, device: torch.device | str
) -> torch.Tensor:
    """The last layer's output for every node: ``(num_nodes, model.layer_dims[-1])`` float32 on ``device``.

    Args:
        model: on ``device``, with ``num_layers``, ``layer_dims`` and ``forward_layer(layer, block, h)`` (as the
            models of ``distgnn.nn``).
        g: a DistGraph or an InProcessGraph whose every node this process computes (one trainer).
        features: ``(num_nodes, F)`` input rows indexed by a ``device`` id tensor, returning rows on ``device``
            (a ``CachedFeature`` on ``device``, or a device tensor); other feature stores are read by CPU ids
            and copied over.
        batch_size: destination nodes per block (large: the step is launch-bound below ~100k).
        device: where sampling, the layers and the outputs live (a CPU device runs the same steps there).

    Each hidden layer's output takes ``num_nodes * layer_dims[layer] * 4`` bytes of device memory (two of them
    at a time). Ids are batched in order, so a batch's output is one contiguous slice of the buffer.
    """
    if model.num_layers < 1:
        raise InputError(f"layer-wise inference needs a model with at least one layer, got {model.num_layers}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # as the tensors on it name it
        device = torch.device("cuda", torch.cuda.current_device())
    num_nodes = int(g.num_nodes())
    sampler = NeighborSampler([-1], device=device if device.type == "cuda" else None)
    whole: WholeCSC | None = None
    x = features
    model.eval()
    try:
        with torch.no_grad():
            if _is_sage(model, 0) and not _whole_tensor(x, device, num_nodes):
                # Every node's input row on the device once (as a hidden layer's output is), read in batches.
                ids = torch.arange(num_nodes, device=device)
                x = torch.cat([_rows(features, part, device).float() for part in ids.split(batch_size)])
            for layer in range(model.num_layers):
                out = torch.empty((num_nodes, model.layer_dims[layer]), dtype=torch.float32, device=device)
                if _aggregates_whole(model, layer, x, device, num_nodes):
                    whole = whole or WholeCSC(g, device)
                    for start in range(0, num_nodes, batch_size):
                        end = min(start + batch_size, num_nodes)
                        block = whole.block(start, end)
                        rows = torch.cat([x[start:end], aggregate.mean(block, x)], dim=1)
                        out[start:end] = model.forward_layer(layer, block, SelfAndMean(rows))
                else:
                    for start in range(0, num_nodes, batch_size):
                        end = min(start + batch_size, num_nodes)
                        _, _, (block,) = sampler.sample_blocks(g, torch.arange(start, end))
                        block = block.to(device)
                        out[start:end] = model.forward_layer(layer, block, _rows(x, block.src_nids, device))
                x = out
    finally:
        sampler.close()
    return x


def _aggregates_whole(model: torch.nn.Module, layer: int, x: Any, device: torch.device, num_nodes: int) -> bool:
    """Whether ``layer`` can read its neighbours straight from ``x``: a SAGE layer over a whole float32 tensor
    of every node's rows on ``device``."""
    return _is_sage(model, layer) and _whole_tensor(x, device, num_nodes)


def _is_sage(model: torch.nn.Module, layer: int) -> bool:
    layers = getattr(model, "layers", None)
    return layers is not None and isinstance(layers[layer], SAGEConv)


def _whole_tensor(x: Any, device: torch.device, num_nodes: int) -> bool:
    """Whether ``x`` is every node's float32 rows in one tensor on ``device``."""
    return (
        isinstance(x, torch.Tensor)
        and x.device == device
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.shape[0] == num_nodes
    )


class WholeCSC:
    """The graph's in-edge CSC over global ids on ``device`` (one edge type), and batches of consecutive
    destinations as Blocks over it: ``indptr`` a shifted slice, ``indices`` a view whose ids index the whole
    previous layer's output (``src_nids`` is left empty: the sources are every node, in id order)."""

    def __init__(self, g: Any, device: torch.device):
        csc = g.replicated_structure()
        if csc.num_etypes != 1 or csc.node_start != 0:
            raise InputError("whole-graph aggregation needs a homogeneous graph's CSC over global ids")
        self.host_indptr = csc.indptr
        self.indptr = torch.from_numpy(csc.indptr).to(device)
        indices = torch.from_numpy(csc.indices)
        # The CPU mean kernel takes int64 ids; the CUDA one reads int32 as they are.
        self.indices = indices.to(device) if device.type == "cuda" else indices.to(torch.int64)
        self.device = device

    def block(self, start: int, end: int) -> Block:
        """Destinations ``[start, end)`` with all their in-edges (positions and bounds known on the host)."""
        first, last = int(self.host_indptr[start]), int(self.host_indptr[end])
        indptr = self.indptr[start : end + 1] - first
        indices = self.indices[first:last]
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        return Block(src_nids=empty, num_dst=end - start, indptr=indptr, indices=indices, eids=empty)


def _rows(features: Any, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``features[ids]`` on ``device``: by device ids where the store takes them, else by CPU ids."""
    if isinstance(features, torch.Tensor):
        return features[ids.to(features.device)].to(device)
    if getattr(features, "device", None) == ids.device:  # a CachedFeature on this device
        return features[ids]
    return features[ids.cpu()].to(device)
