"""Layer-wise inference held on one GPU: every layer's output for all nodes stays in device memory.

:func:`distgnn.train.inference.layerwise_inference` moves each batch's inputs to the device and its outputs back to
a node tensor in host memory (or on the servers), and samples full neighbourhoods on the CPU. When one
trainer computes every node (one GPU, one machine) and a layer's output fits in GPU memory, all of that can
stay on the GPU: the GPU sampler builds the full-neighbour blocks of large batches of consecutive ids, the
inputs are read by device ids (through a :class:`~distgnn.cache.dist_feature.CachedFeature` or from a device
tensor), and each batch's output is written straight into its rows of the next layer's input buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from distgnn.errors import InputError
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
    num_nodes = int(g.num_nodes())
    sampler = NeighborSampler([-1], device=device if device.type == "cuda" else None)
    x = features
    model.eval()
    try:
        with torch.no_grad():
            for layer in range(model.num_layers):
                out = torch.empty((num_nodes, model.layer_dims[layer]), dtype=torch.float32, device=device)
                for start in range(0, num_nodes, batch_size):
                    end = min(start + batch_size, num_nodes)
                    _, _, (block,) = sampler.sample_blocks(g, torch.arange(start, end))
                    block = block.to(device)
                    out[start:end] = model.forward_layer(layer, block, _rows(x, block.src_nids, device))
                x = out
    finally:
        sampler.close()
    return x


def _rows(features: Any, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``features[ids]`` on ``device``: by device ids where the store takes them, else by CPU ids."""
    if isinstance(features, torch.Tensor):
        return features[ids.to(features.device)].to(device)
    if getattr(features, "device", None) == ids.device:  # a CachedFeature on this device
        return features[ids]
    return features[ids.cpu()].to(device)
