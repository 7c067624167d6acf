"""The checkpoint system in one process: a state as JSON plus named arrays, named pieces saved and restored
(shared and per-rank ones), and the refusals of a checkpoint taken for another job."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from distgnn.errors import CheckpointError
from distgnn.store.checkpoint_files import read_arrays
from distgnn.train.checkpoint import Checkpointer, Position
from distgnn.train.checkpoint_pieces import GeneratorState, PerRank
from distgnn.train.state_codec import decode, encode


def test_a_nested_state_round_trips_with_its_tensors_named_by_path():
    state = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4, dtype=torch.bfloat16)}},
        "groups": [{"lr": 0.1, "betas": (0.9, 0.99), "name": None}],
        "rows": np.array([True, False]),
    }
    tree, arrays = encode(state, "optimizer")
    assert sorted(arrays) == ["optimizer.rows", "optimizer.state.0.exp_avg", "optimizer.state.0.step"]
    back = decode(json.loads(json.dumps(tree)), arrays)
    assert back["state"][0]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(back["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert back["groups"] == [{"lr": 0.1, "betas": (0.9, 0.99), "name": None}]
    np.testing.assert_array_equal(back["rows"], state["rows"])
    with pytest.raises(CheckpointError, match="cannot store a object"):
        encode({"x": object()}, "bad")


class Counter:
    def __init__(self) -> None:
        self.value = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"].clone()


def pieces(model, generator, counter) -> dict:
    return {"model": model, "rng": PerRank(GeneratorState(generator)), "counter": PerRank(counter)}


def test_pieces_are_saved_and_restored_and_another_job_is_refused(tmp_path):
    torch.manual_seed(0)
    model, generator, counter = torch.nn.Linear(3, 2), torch.Generator().manual_seed(5), Counter()
    counter.value += 7
    path = Checkpointer(tmp_path, 0, facts={"events": 10}).save(4, 1, pieces(model, generator, counter))
    assert {"model.weight.npy", "model.bias.npy", "rank0.rng.npy", "rank0.counter.value.npy"} == set(read_arrays(path))
    expected = torch.rand(2, generator=generator)  # what the generator draws after the checkpoint

    torch.manual_seed(1)
    other, again, fresh = torch.nn.Linear(3, 2), torch.Generator().manual_seed(9), Counter()
    position = Checkpointer(tmp_path, 0, facts={"events": 10}).resume("auto", pieces(other, again, fresh))
    assert position == Position(4, 1, 0, path)
    assert torch.equal(other.weight, model.weight) and torch.equal(fresh.value, counter.value)
    assert torch.equal(torch.rand(2, generator=again), expected)

    with pytest.raises(CheckpointError, match=r"was taken for \{'events': 10\}, this job is \{'events': 11\}"):
        Checkpointer(tmp_path, 0, facts={"events": 11}).resume("auto", pieces(other, again, fresh))
    with pytest.raises(CheckpointError, match="holds another model: "):
        Checkpointer(tmp_path, 0, facts={"events": 10}).resume("auto", pieces(torch.nn.Linear(3, 4), again, fresh))
    with pytest.raises(CheckpointError, match="holds pieces"):
        Checkpointer(tmp_path, 0, facts={"events": 10}).resume("auto", {"model": other})
