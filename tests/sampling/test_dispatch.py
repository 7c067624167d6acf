"""One dispatch point: the sampler picks its backend at construction, and from ``sample_blocks`` the call path
enters each file of ``distgnn/sampling/`` at most once per layer, homogeneous (one edge type) and typed alike."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import pytest
from hetero_graphs import toy_hetero

from distgnn.data.graph import Graph
from distgnn.sampling import cpu, gpu
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph

SAMPLING = Path(cpu.__file__).resolve().parent


def _graph() -> InProcessGraph:
    rng = np.random.default_rng(0)
    n, m = 400, 4000
    graph = Graph("g", n, rng.integers(0, n, m), rng.integers(0, n, m), {"feat": np.zeros((n, 2), np.float32)})
    return InProcessGraph(graph)


def _entries(sampler: NeighborSampler, g: InProcessGraph, seeds: np.ndarray) -> collections.Counter:
    """How often the call path of one ``sample_blocks`` enters each sampling file from another file."""
    entered: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        caller = frame.f_back.f_code.co_filename if frame.f_back else ""
        # kernels.py wraps the C++ ops one function each (the backend calls several per layer): not dispatch.
        if path.parent == SAMPLING and path.name != "kernels.py" and caller != frame.f_code.co_filename:
            entered[path.name] += 1

    sys.setprofile(profile)
    try:
        sampler.sample_blocks(g, seeds, rng_seed=3)
    finally:
        sys.setprofile(None)
    return entered


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("typed", [False, True], ids=["homogeneous", "typed"])
def test_each_sampling_file_is_entered_at_most_once_per_layer(device, typed) -> None:
    g = InProcessGraph(toy_hetero(seed=1)) if typed else _graph()
    seeds = np.arange(0, g.num_nodes(), 7)
    three = _entries(NeighborSampler([3, 2, 4], device=device), g, seeds)
    four = _entries(NeighborSampler([2, 3, 2, 4], device=device), g, seeds)
    per_layer = {name: four[name] - three[name] for name in four}
    assert max(per_layer.values()) == 1, per_layer  # a layer more enters no file twice
    backend = "cpu.py" if device is None else "gpu.py"
    assert three["neighbor.py"] == 1  # sample_blocks itself
    # The batch's frontier, its layers, then one call per layer from the layer loop into the chosen backend.
    assert three[backend] == 1 + 1 + 3
    assert ("gpu.py" in three) == (device is not None)


def test_the_backend_is_chosen_once_at_construction() -> None:
    assert isinstance(NeighborSampler([2])._backend, cpu.CpuSampling)
    backend = NeighborSampler([2], device="cpu")._backend
    assert isinstance(backend, gpu.DeviceSampling) and backend.device.type == "cpu"
