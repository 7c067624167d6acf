"""GatherAhead: batches and their features one batch ahead, equal to gathering in the loop."""

from __future__ import annotations

import pytest
import torch

from distgnn.cache.pipeline import GatherAhead
from distgnn.data import synthetic
from distgnn.loader.node import DistNodeDataLoader
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def graph():
    return InProcessGraph(synthetic(3000, 8, feat_dim=12, num_classes=3, seed=2))


def make_loader(graph, prefetch: int) -> DistNodeDataLoader:
    return DistNodeDataLoader(
        graph,
        torch.arange(0, 3000, 3),
        NeighborSampler([4, 3]),
        64,
        shuffle=True,
        prefetch=prefetch,
        seed=5,
        output_feats=("label",) if prefetch else (),
    )


def expected_epoch(graph) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with make_loader(graph, 0) as loader:
        return [(batch[0].clone(), graph.ndata["feat"][batch[0]]) for batch in loader]


def check_epoch(graph, device: str, features) -> None:
    expected = expected_epoch(graph)
    with make_loader(graph, prefetch=2) as loader:
        got = list(GatherAhead(loader, features, device))
    assert len(got) == len(expected) == len(loader)
    for (batch, x), (input_nodes, feats) in zip(got, expected, strict=True):
        assert batch[0].device.type == x.device.type == torch.device(device).type
        assert torch.equal(batch[0].cpu(), input_nodes)
        assert torch.equal(x.cpu(), feats)
        assert torch.equal(batch.output_data["label"].cpu(), graph.ndata["label"][batch[1].cpu()])
        assert all(b.indptr.device.type == torch.device(device).type for b in batch[2])


def test_gather_ahead_on_cpu_yields_the_loaders_batches_with_their_features(graph) -> None:
    check_epoch(graph, "cpu", lambda ids: graph.ndata["feat"][ids])


def test_leaving_an_epoch_early_cancels_the_loader_and_the_next_epoch_is_whole(graph) -> None:
    with make_loader(graph, prefetch=2) as loader:
        ahead = GatherAhead(loader, lambda ids: graph.ndata["feat"][ids], "cpu")
        batches = iter(ahead)
        next(batches)
        next(batches)
        del batches
        assert len(list(ahead)) == len(loader)


@cuda
def test_gather_ahead_on_a_gpu_matches_the_loop_and_waits_for_the_side_stream(graph) -> None:
    table = graph.ndata["feat"].cuda()
    weight = torch.randn(2048, 2048, device="cuda")

    def slow_features(ids: torch.Tensor) -> torch.Tensor:
        # Queue seconds of work on the current (side) stream before the gather, so a consumer that did not
        # wait for the batch's event would read rows not yet written.
        for _ in range(20):
            weight @ weight
        out = torch.empty((len(ids), table.shape[1]), device="cuda")
        torch.index_select(table, 0, ids.cuda(non_blocking=True), out=out)
        return out

    check_epoch(graph, "cuda", slow_features)
