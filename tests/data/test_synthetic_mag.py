"""synthetic_mag: OGB-MAG's shape, determinism, power-law degrees, a label carried by the graph rather than the
paper features, and the generate -> chunked -> read pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.data.chunked import read_chunked, write_chunked
from distgnn.data.hetero import materialize
from distgnn.data.synthetic_mag import (
    AFFILIATED_WITH,
    CITES,
    HAS_TOPIC,
    REVERSE_ETYPES,
    WRITES,
    reverse_etype,
    synthetic_mag,
)
from distgnn.errors import InputError

NUM_PAPERS = 10_000


@pytest.fixture(scope="module")
def graph():
    return synthetic_mag(NUM_PAPERS, seed=0)


def test_types_counts_and_dtypes(graph):
    graph.validate()
    assert graph.num_nodes == {"paper": 10_000, "author": 15_000, "institution": 120, "field_of_study": 800}
    assert graph.canonical_etypes[:4] == [WRITES, CITES, AFFILIATED_WITH, HAS_TOPIC]
    assert set(graph.canonical_etypes[4:]) == set(REVERSE_ETYPES.values())
    per_paper = {etype: graph.num_edges(etype) / NUM_PAPERS for etype in (WRITES, CITES, HAS_TOPIC)}
    assert 8.5 < per_paper[WRITES] < 10.5 and 6 < per_paper[CITES] < 7.5 and 8 < per_paper[HAS_TOPIC] < 10.5
    assert graph.num_edges(AFFILIATED_WITH) == 15_000
    paper = graph.ndata["paper"]
    assert paper["feat"].dtype == np.float32 and paper["feat"].shape == (NUM_PAPERS, 128)
    assert paper["label"].dtype == np.int64 and set(np.unique(paper["label"])) == set(range(graph.num_classes))
    masks = np.stack([paper["train_mask"], paper["val_mask"], paper["test_mask"]])
    assert masks.dtype == bool and (masks.sum(0) == 1).all()
    assert 0.83 < paper["train_mask"].mean() < 0.87
    assert set(graph.ndata) == {"paper"}


def test_edges_distinct_reverses_exact_and_every_paper_reached(graph):
    for etype, (src, dst) in graph.edges.items():
        num_dst = graph.num_nodes[etype[2]]
        assert np.unique(src * num_dst + dst).size == src.size, etype
    assert not (graph.edges[CITES][0] == graph.edges[CITES][1]).any()
    for forward, reverse in REVERSE_ETYPES.items():
        np.testing.assert_array_equal(graph.edges[reverse][0], graph.edges[forward][1])
        np.testing.assert_array_equal(graph.edges[reverse][1], graph.edges[forward][0])
    assert np.bincount(graph.edges[WRITES][1], minlength=NUM_PAPERS).min() >= 1
    assert np.bincount(graph.edges[HAS_TOPIC][0], minlength=NUM_PAPERS).min() >= 1
    assert np.bincount(graph.edges[AFFILIATED_WITH][0], minlength=15_000).min() == 1


def test_degrees_are_heavy_tailed(graph):
    for etype, end in ((WRITES, 0), (HAS_TOPIC, 1), (CITES, 1), (AFFILIATED_WITH, 1)):
        degree = np.bincount(graph.edges[etype][end], minlength=graph.num_nodes[etype[2 * end]])
        assert degree.max() > 8 * degree.mean(), etype


def test_deterministic_by_seed():
    a, b, c = synthetic_mag(300, seed=4), synthetic_mag(300, seed=4), synthetic_mag(300, seed=5)
    for etype in a.edges:
        np.testing.assert_array_equal(a.edges[etype][0], b.edges[etype][0])
        np.testing.assert_array_equal(a.edges[etype][1], b.edges[etype][1])
    np.testing.assert_array_equal(a.ndata["paper"]["feat"], b.ndata["paper"]["feat"])
    assert not np.array_equal(a.ndata["paper"]["feat"], c.ndata["paper"]["feat"])
    assert not np.array_equal(a.edges[WRITES][0], c.edges[WRITES][0])


def _features_only_accuracy(graph) -> float:
    """Nearest class mean on paper features (the best rule for Gaussian classes of equal spread)."""
    paper = graph.ndata["paper"]
    feat, label, train, test = paper["feat"], paper["label"], paper["train_mask"], paper["test_mask"]
    centroids = np.stack([feat[train & (label == c)].mean(0) for c in range(graph.num_classes)])
    distance = ((feat[test][:, None, :] - centroids[None]) ** 2).sum(-1)
    return float((distance.argmin(1) == label[test]).mean())


def _through_fields_accuracy(graph) -> float:
    """Neighbour majority over two hops paper -> field -> paper, counting only train labels."""
    paper = graph.ndata["paper"]
    label, train, test = paper["label"], paper["train_mask"], paper["test_mask"]
    papers, fields = graph.edges[HAS_TOPIC]
    seen = train[papers]
    per_field = np.zeros((graph.num_nodes["field_of_study"], graph.num_classes))
    np.add.at(per_field, (fields[seen], label[papers[seen]]), 1.0)
    per_field /= np.maximum(per_field.sum(1, keepdims=True), 1.0)
    score = np.zeros((graph.num_nodes["paper"], graph.num_classes))
    np.add.at(score, papers, per_field[fields])
    return float((score[test].argmax(1) == label[test]).mean())


def test_label_comes_from_the_graph_more_than_the_features(graph):
    features_only = _features_only_accuracy(graph)
    through_fields = _through_fields_accuracy(graph)
    assert features_only > 1.5 / graph.num_classes  # the features are a weak signal, not none
    assert through_fields >= features_only + 0.10, (through_fields, features_only)


def test_without_homophily_the_graph_carries_no_label():
    graph = synthetic_mag(3000, seed=1, homophily=0.0)
    assert _through_fields_accuracy(graph) < 2.0 / graph.num_classes


def test_bad_arguments():
    with pytest.raises(InputError, match="num_papers >= 100"):
        synthetic_mag(10)
    with pytest.raises(InputError, match="homophily"):
        synthetic_mag(1000, homophily=1.5)
    with pytest.raises(InputError, match="power_law_exponent"):
        synthetic_mag(1000, power_law_exponent=2.0)


def test_generate_write_chunked_read_back(tmp_path):
    graph = synthetic_mag(500, seed=2, feat_dim=8)
    back = read_chunked(write_chunked(graph, tmp_path / "mag", num_chunks=3))
    assert back.name == "synthetic-mag" and back.num_classes == graph.num_classes
    assert back.num_nodes == graph.num_nodes and back.canonical_etypes == graph.canonical_etypes
    for etype, (src, dst) in graph.edges.items():
        np.testing.assert_array_equal(back.edges[etype][0], src)
        np.testing.assert_array_equal(back.edges[etype][1], dst)
    for name, array in graph.ndata["paper"].items():
        got = materialize(back.ndata["paper"][name])
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


def test_reverse_etype_names_the_reverse_either_way_round():
    for forward, backward in REVERSE_ETYPES.items():
        assert reverse_etype(forward) == backward and reverse_etype(backward) == forward
    assert reverse_etype(CITES) is None and reverse_etype(("paper", "reads", "paper")) is None
