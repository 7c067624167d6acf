"""Layer-wise inference held on one device: equals the model on full neighbourhoods (CPU here, GPU where there)."""

from __future__ import annotations

import pytest
import torch

from distgnn.data import synthetic
from distgnn.errors import InputError
from distgnn.nn import GAT, GraphSAGE
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph
from distgnn.train.inference_gpu import layerwise_inference_on_device

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def graph() -> InProcessGraph:
    return InProcessGraph(synthetic(400, 6.0, 12, 4, seed=5))


def full_neighbourhood_output(model, g, nodes) -> torch.Tensor:
    _, _, blocks = NeighborSampler([-1] * model.num_layers).sample_blocks(g, nodes)
    with torch.no_grad():
        return model.cpu()(blocks, g.ndata["feat"][blocks[0].src_nids])


CASES = [(device, model) for device in DEVICES for model in ("sage", "gat")]
MODELS = {"sage": lambda: GraphSAGE(12, 16, 4, 3, 0.5), "gat": lambda: GAT(12, 8, 4, 2, 2, 0.5)}


@pytest.mark.parametrize(("device", "model_name"), CASES)
@pytest.mark.parametrize("batch_size", [64, 1000])
def test_every_nodes_output_matches_the_model_on_full_neighbourhoods(graph, device, model_name, batch_size) -> None:
    make = MODELS[model_name]
    torch.manual_seed(0)
    model = make().to(device)
    features = graph.ndata["feat"].to(device)
    got = layerwise_inference_on_device(model, graph, features, batch_size, device)
    assert got.shape == (graph.num_nodes(), 4) and got.device.type == device and got.dtype == torch.float32
    nodes = torch.randperm(graph.num_nodes())[:60]
    want = full_neighbourhood_output(model, graph, nodes)
    torch.testing.assert_close(got[nodes.to(device)].cpu(), want, rtol=1e-4, atol=1e-4)


def test_features_in_host_memory_are_read_by_cpu_ids(graph) -> None:
    torch.manual_seed(2)
    model = GraphSAGE(12, 8, 4, 2, 0.0)
    got = layerwise_inference_on_device(model, graph, graph.ndata["feat"], 100, "cpu")
    assert not model.training  # put in eval mode: no dropout
    torch.testing.assert_close(
        got[:30], full_neighbourhood_output(model, graph, torch.arange(30)), rtol=1e-4, atol=1e-5
    )


def test_bad_arguments_raise(graph) -> None:
    with pytest.raises(InputError, match="batch_size"):
        layerwise_inference_on_device(GraphSAGE(12, 8, 4, 2), graph, graph.ndata["feat"], 0, "cpu")


class HostRows:
    """A feature store read by CPU id tensors (as a DistTensor is), not a tensor."""

    def __init__(self, table: torch.Tensor):
        self.table = table

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.device.type == "cpu"
        return self.table[ids]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("store", ["tensor", "rows by id"])
def test_a_sage_model_aggregates_without_sampling(graph, device, store, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a SAGE layer over a whole tensor sampled a block")

    torch.manual_seed(3)
    model = GraphSAGE(12, 16, 4, 3, 0.5).to(device)
    monkeypatch.setattr(NeighborSampler, "sample_blocks", refuse)
    features = graph.ndata["feat"].to(device) if store == "tensor" else HostRows(graph.ndata["feat"])
    got = layerwise_inference_on_device(model, graph, features, 97, device)
    monkeypatch.undo()
    nodes = torch.arange(0, graph.num_nodes(), 7)
    torch.testing.assert_close(
        got[nodes.to(device)].cpu(), full_neighbourhood_output(model, graph, nodes), rtol=1e-4, atol=1e-4
    )


def test_layerwise_inference_takes_the_on_device_path_only_for_one_process_on_a_gpu(graph, monkeypatch) -> None:
    import distgnn.train.inference_gpu as on_device
    from distgnn.train.inference import layerwise_inference

    calls = []

    def fake(model, g, features, batch_size, device):  # records the call; the path itself is tested above
        calls.append(features)
        return torch.arange(g.num_nodes() * 4, dtype=torch.float32).reshape(-1, 4)

    monkeypatch.setattr(on_device, "layerwise_inference_on_device", fake)
    model = GraphSAGE(12, 8, 4, 2, 0.0)
    every = torch.arange(graph.num_nodes())
    cached = object()
    out = layerwise_inference(model, graph, every.flip(0), graph.ndata["feat"], 100, "cuda", None, cached)
    assert calls == [cached] and torch.equal(out[:, 0], every.flip(0).float() * 4)
    for nodes, device, feats in [
        (every[:50], "cuda", graph.ndata["feat"]),  # a share of the nodes: other trainers compute the rest
        (every, "cpu", graph.ndata["feat"]),
        (every, "cuda", lambda block: None),  # rows from a function of the block (typed inputs)
    ]:
        with pytest.raises(TypeError):  # the host path: it calls new_buffer, None here
            layerwise_inference(model, graph, nodes, feats, 100, device, None)
    assert len(calls) == 1
