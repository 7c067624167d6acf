"""train.collective over two gloo ranks: variable-length arrays gathered in rank order, to all or one rank, and
scattered back; JSON objects broadcast and gathered; rows of different shapes refused on every rank; model
selection (train.selection) taking rank 0's decision on both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from netns_cluster import free_port
from spawned import run_ranks

from distgnn.train import collective
from tests.train import test_selection


def _rows(rank: int) -> np.ndarray:
    """Rank r sends 2r + 1 rows of 3 (rank 0 one row, rank 1 three)."""
    return np.arange(3 * (2 * rank + 1), dtype=np.float64).reshape(-1, 3) + 100 * rank


def _member(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from distgnn.errors import InputError

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        got = {"numpy": collective.all_gather_arrays(_rows(rank))}
        got["torch"] = [t.numpy() for t in collective.all_gather_arrays(torch.from_numpy(_rows(rank)))]
        got["known"] = collective.all_gather_arrays(np.full(rank + 1, rank, np.int64), counts=[1, 2])
        gathered = collective.gather_arrays(torch.from_numpy(_rows(rank)), dst=1)
        got["gather"] = None if gathered is None else [t.numpy() for t in gathered]
        replies = [torch.full((2 * r + 1, 3), float(r)) for r in range(2)] if rank == 1 else None
        got["scatter"] = collective.scatter_arrays(replies, torch.empty(2 * rank + 1, 3), src=1).numpy()
        got["broadcast"] = collective.broadcast_object({"path": "/ckpt", "steps": (1, 2)} if rank == 0 else None)
        got["objects"] = collective.all_gather_objects({"rank": rank, "name": "é" * rank})
        got["selection"] = test_selection.two_ranks_select(rank)
        try:
            collective.all_gather_arrays(np.zeros((2, 3 + rank)))
        except InputError as exc:
            got["error"] = str(exc)
        out.put((rank, got))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_gather_scatter_and_broadcast() -> None:
    results = run_ranks(_member, (free_port(),), clean_exit=True)
    for rank, got in results.items():
        for kind in ("numpy", "torch"):
            assert [a.shape for a in got[kind]] == [(1, 3), (3, 3)]
            for r in range(2):
                np.testing.assert_array_equal(got[kind][r], _rows(r))
        assert [a.tolist() for a in got["known"]] == [[0], [1, 1]]
        if rank == 1:
            assert [a.tolist() for a in got["gather"]] == [_rows(0).tolist(), _rows(1).tolist()]
        else:
            assert got["gather"] is None
        np.testing.assert_array_equal(got["scatter"], np.full((2 * rank + 1, 3), float(rank)))
        assert got["broadcast"] == {"path": "/ckpt", "steps": [1, 2]}
        assert got["objects"] == [{"rank": 0, "name": ""}, {"rank": 1, "name": "é"}]
        assert "(2, 3), (2, 4)" in got["error"]
    test_selection.check_two_ranks_selected_alike({rank: got["selection"] for rank, got in results.items()})


def test_one_process_is_the_identity_and_objects_come_back_as_json_reads_them() -> None:
    rows = torch.arange(6).reshape(3, 2)
    assert collective.all_gather_arrays(rows)[0] is rows
    assert collective.gather_arrays(rows, dst=0)[0] is rows
    assert collective.broadcast_object({"steps": (1, 2)}) == {"steps": [1, 2]}
    assert collective.all_gather_objects([("a", 1)]) == [[["a", 1]]]
    assert collective.world() == (0, 1)
