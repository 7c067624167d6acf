"""Layer-wise inference gives the model's full-neighbourhood output, whoever computes which nodes."""

from __future__ import annotations

import pytest
import torch

from distgnn.data import synthetic
from distgnn.errors import InputError
from distgnn.nn import GAT, GraphSAGE
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler
from distgnn.train.inference import accuracy_by_mask, layerwise_inference


@pytest.fixture(scope="module")
def graph() -> InProcessGraph:
    return InProcessGraph(synthetic(300, 5.0, 12, 4, seed=3))


def full_neighbourhood_output(model, g, nodes) -> torch.Tensor:
    _, _, blocks = NeighborSampler([-1] * model.num_layers).sample_blocks(g, nodes)
    with torch.no_grad():
        return model(blocks, g.ndata["feat"][blocks[0].src_nids])


@pytest.mark.parametrize("make", [lambda: GraphSAGE(12, 16, 4, 3, 0.5), lambda: GAT(12, 8, 4, 2, 2, 0.5)])
def test_layerwise_output_matches_the_model_on_full_neighbourhoods(graph, make) -> None:
    torch.manual_seed(0)
    model = make().eval()
    nodes = torch.randperm(graph.num_nodes())[:50]
    buffers = []

    def new_buffer(layer, dim):
        buffers.append((layer, dim))
        return torch.zeros(graph.num_nodes(), dim)

    everyone = torch.arange(graph.num_nodes())
    got = layerwise_inference(model, graph, everyone, graph.ndata["feat"], 64, torch.device("cpu"), new_buffer)
    assert got.shape == (graph.num_nodes(), 4) and got.dtype == torch.float32
    assert buffers == [(layer, model.layer_dims[layer]) for layer in range(model.num_layers - 1)]
    torch.testing.assert_close(got[nodes], full_neighbourhood_output(model, graph, nodes), rtol=1e-4, atol=1e-5)


def test_a_trainer_computes_only_its_nodes_and_reads_the_others_rows_from_the_buffer(graph) -> None:
    torch.manual_seed(1)
    model = GraphSAGE(12, 16, 4, 2, 0.0).eval()
    everyone = torch.arange(graph.num_nodes())
    hidden = {}

    def keep(layer, dim):
        hidden[layer] = torch.zeros(graph.num_nodes(), dim)
        return hidden[layer]

    whole = layerwise_inference(model, graph, everyone, graph.ndata["feat"], 100, "cpu", keep)
    # The other trainer already wrote its rows of layer 0; this one writes the rest.
    mine = everyone[everyone % 3 == 0]
    shared = hidden[0].clone()
    shared[mine] = float("nan")
    got = layerwise_inference(model, graph, mine, graph.ndata["feat"], 7, "cpu", lambda layer, dim: shared)
    torch.testing.assert_close(got, whole[mine])
    torch.testing.assert_close(shared, hidden[0])


def test_a_model_without_layers_is_refused(graph) -> None:
    model = GraphSAGE(12, 16, 4, 1)
    model.layers = torch.nn.ModuleList()
    with pytest.raises(InputError, match="at least one layer"):
        layerwise_inference(model, graph, torch.arange(3), graph.ndata["feat"], 10, "cpu", None)


def test_accuracy_counts_each_mask_separately() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])  # predicts 0, 1, 0, 1
    labels = torch.tensor([0, 0, 0, 1])
    masks = {"val": torch.tensor([1, 1, 0, 0]), "test": torch.tensor([0, 0, 1, 1]), "none": torch.zeros(4)}
    assert accuracy_by_mask(logits, labels, masks) == {"val": 0.5, "test": 1.0, "none": 0.0}
