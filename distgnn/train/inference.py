"""Layer-wise inference: every node's output, one layer at a time over the whole graph.

Sampled mini-batches would recompute the lower layers of every neighbour many times over; here each
trainer computes its share of a layer's output for all its nodes (every in-neighbour, no sampling) into a
node tensor every trainer can read (a DistTensor, or a plain tensor in one process), and all meet at a
barrier before the next layer reads it.

On a heterogeneous graph the same loop runs on typed blocks (every in-edge of every type, the R-GCN
layers of ``distgnn.nn`` read ``block.etypes``), with homogeneous node ids throughout; the input rows come
from a function of the block (per-type features and embeddings, e.g. ``distgnn.nn.TypedInput``), since no
single feature tensor covers every type.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import InputError
from distgnn.sampling.neighbor import NeighborSampler, derive_seed
from distgnn.sampling.source import split_by_type
from distgnn.train.epoch import all_reduce


def layerwise_inference(
    model: torch.nn.Module,
    g: Any,
    nodes: torch.Tensor,
    features: Any,
    batch_size: int,
    device: torch.device,
    new_buffer: Callable[[int, int], Any],
    device_features: Any = None,
) -> torch.Tensor:
    """The last layer's output for ``nodes``: ``(len(nodes), model.layer_dims[-1])`` float32 on the CPU.

    Where this one process computes every node on a GPU (one trainer), every layer's output stays on the
    device instead (:func:`distgnn.train.inference_gpu.layerwise_inference_on_device`): the one place that
    chooses between the two.

    Args:
        model: has ``num_layers``, ``layer_dims`` (output width per layer) and
            ``forward_layer(layer, block, h)`` (as the models of ``distgnn.nn``).
        g: a DistGraph or an InProcessGraph.
        nodes: ``(n,)`` int64 global ids this trainer computes; the trainers' ``nodes`` together cover
            every node the next layer reads (all nodes, for a model over the whole graph).
        features: ``(num_nodes, F)`` input rows indexed by CPU id tensors (``g.ndata["feat"]``), or a function
            ``features(block)`` returning the first layer's input rows for ``block.src_nids`` on ``device``
            (a heterogeneous graph: see :func:`typed_input_rows`).
        batch_size: destination nodes per block.
        device: where each layer runs.
        new_buffer: ``new_buffer(layer, dim)`` returns a ``(num_nodes, dim)`` node tensor indexable by global
            id for a hidden layer's output (:meth:`distgnn.train.job.Trainer.new_buffer`).
        device_features: the same rows read by ``device`` ids (e.g. the trainer's GPU feature cache), for the
            on-device path; ``features`` when None.
    """
    if model.num_layers < 1:
        raise InputError(f"layer-wise inference needs a model with at least one layer, got {model.num_layers}")
    if _one_process_on_gpu(g, nodes, features, device):
        from distgnn.train.inference_gpu import layerwise_inference_on_device

        rows = features if device_features is None else device_features
        out = layerwise_inference_on_device(model, g, rows, batch_size, device)
        return out[nodes.to(out.device)].cpu()
    sampler = NeighborSampler([-1])

    def run_layer(layer: int, x: Any, batch: torch.Tensor) -> torch.Tensor:
        _, _, (block,) = sampler.sample_blocks(g, batch)
        block = block.to(device)
        rows = x(block) if callable(x) and not hasattr(x, "__getitem__") else x[block.src_nids.cpu()].to(device)
        return model.forward_layer(layer, block, rows).cpu()

    x = features
    last = model.num_layers - 1
    model.eval()
    with torch.no_grad():
        for layer in range(last):
            out = new_buffer(layer, model.layer_dims[layer])
            for batch in torch.split(nodes, batch_size):
                out[batch] = run_layer(layer, x, batch)
            _barrier()  # the next layer reads rows other trainers wrote
            x = out
        outputs = [run_layer(last, x, batch) for batch in torch.split(nodes, batch_size)]
        _barrier()
    return torch.cat(outputs) if outputs else torch.zeros(0, model.layer_dims[-1])


def typed_input_rows(g: Any, inputs: torch.nn.Module, device: torch.device) -> Callable[[Any], torch.Tensor]:
    """``features`` for :func:`layerwise_inference` on a heterogeneous graph: ``inputs`` (a
    :class:`distgnn.nn.TypedInput`) applied to each block's source nodes, split by type."""
    from distgnn.sampling.source import split_by_type

    book = g.get_partition_book()

    def rows(block: Any) -> torch.Tensor:
        return inputs(split_by_type(book, block.src_nids), block.src_ntypes, device)

    return rows


def embedding_lookup(
    model: torch.nn.Module,
    g: Any,
    nodes: torch.Tensor,
    features: Any,
    batch_size: int,
    device: torch.device,
    new_buffer: Callable[[int, int], Any],
) -> Callable[[np.ndarray], torch.Tensor]:
    """Every node's last-layer embedding by :func:`layerwise_inference` (arguments as there), kept in a node
    tensor every trainer reads; returns ``lookup(ids)``: the ``(len(ids), d)`` rows of numpy ``ids`` on
    ``device`` (e.g. for :func:`distgnn.train.evaluation.held_out_metrics`). Collective."""
    table = new_buffer(model.num_layers, model.layer_dims[-1])
    table[nodes] = layerwise_inference(model, g, nodes, features, batch_size, device, new_buffer)
    _barrier()  # every trainer's embeddings written before any are read
    return lambda ids: table[torch.from_numpy(ids)].to(device)


def sampled_embedding_lookup(
    embed: Callable[[Any, list], torch.Tensor], g: Any, fanouts: list, seed: int, device: torch.device
) -> Callable[[np.ndarray], torch.Tensor]:
    """``lookup(ids)``: embeddings of numpy node ``ids`` from their sampled blocks (``fanouts``, a fresh seeded
    stream per call), by ``embed(input_nodes, blocks)`` with the blocks on ``device`` and, on a typed graph,
    ``input_nodes`` as ``{ntype: per-type ids}`` (e.g. a typed model's ``TypedInput`` and R-GCN). For models
    that have no layer-wise form, at the cost of recomputing shared neighbourhoods."""
    sampler, book, calls = NeighborSampler(fanouts), g.get_partition_book(), itertools.count()

    def lookup(ids: np.ndarray) -> torch.Tensor:
        input_nodes, _, blocks = sampler.sample_blocks(g, ids, derive_seed(seed, 2, next(calls)))
        if not book.is_homogeneous:
            input_nodes = {t: nids.to(device) for t, nids in split_by_type(book, input_nodes).items()}
        return embed(input_nodes, [b.to(device) for b in blocks])

    return lookup


def _one_process_on_gpu(g: Any, nodes: torch.Tensor, features: Any, device: torch.device) -> bool:
    """Whether this process alone computes every node of ``g`` on a GPU from a feature table (not a function)."""
    alone = not dist.is_initialized() or dist.get_world_size() == 1
    table = not (callable(features) and not hasattr(features, "__getitem__"))
    return torch.device(device).type == "cuda" and alone and table and len(nodes) == int(g.num_nodes())


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def accuracy_by_mask(logits: torch.Tensor, labels: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """Accuracy of ``logits.argmax(1)`` against ``labels`` on each mask, over every trainer's rows.

    Args:
        logits: ``(n, C)`` this trainer's rows (of :func:`layerwise_inference`).
        labels: ``(n,)`` int64 their labels.
        masks: name -> ``(n,)`` bool (or 0/1) selecting the rows that count for that name.

    Returns name -> correct / counted rows summed over trainers (0.0 where no trainer counted any).
    A collective: every trainer calls it with the same names.
    """
    pred = logits.argmax(1)
    counts = []
    for mask in masks.values():
        mask = mask.bool()
        counts += [float((pred[mask] == labels[mask]).sum()), float(mask.sum())]
    counts = all_reduce(counts)
    return {name: counts[2 * i] / max(counts[2 * i + 1], 1) for i, name in enumerate(masks)}
