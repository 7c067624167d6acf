"""Ranking metrics against direct formulas, and gathered over two gloo trainers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from netns_cluster import free_port

from distgnn.errors import InputError
from distgnn.nn import DotPredictor
from distgnn.train.evaluation import auc, dist_link_metrics, held_out_metrics, link_metrics, ranks


def test_ranks_count_negatives_above_and_half_the_ties():
    pos = torch.tensor([0.9, 0.2, 0.5])
    neg = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.6, 0.2], [0.5, 0.5, 0.5]])
    torch.testing.assert_close(ranks(pos, neg), torch.tensor([1.0, 3.5, 2.5], dtype=torch.float64))
    metrics = link_metrics(pos, neg, hits=(1, 3))
    assert metrics["mrr"] == pytest.approx((1 + 1 / 3.5 + 1 / 2.5) / 3)
    assert metrics["hits@1"] == pytest.approx(1 / 3) and metrics["hits@3"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_auc_is_the_pairwise_win_rate(seed):
    rng = np.random.default_rng(seed)
    pos = torch.from_numpy(rng.integers(0, 5, 30).astype(np.float64))  # integers: many ties
    neg = torch.from_numpy(rng.integers(0, 4, (30, 7)).astype(np.float64))
    diff = pos[:, None, None] - neg.reshape(-1)[None, None, :]
    expected = float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
    assert auc(pos, neg) == pytest.approx(expected)
    assert auc(torch.ones(4), torch.ones(4, 3)) == pytest.approx(0.5)


def test_bad_shapes_are_refused():
    with pytest.raises(InputError, match=r"pos \(P,\) and neg \(P, K\)"):
        ranks(torch.zeros(3), torch.zeros(2, 4))


def _trainer(rank, port, pos, neg, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, dist_link_metrics(pos, neg, hits=(1, 5))))
    finally:
        dist.destroy_process_group()


def test_metrics_over_two_trainers_equal_those_of_all_pairs():
    rng = np.random.default_rng(3)
    pos, neg = torch.from_numpy(rng.random(25)).float(), torch.from_numpy(rng.random((25, 10))).float()
    shares = [(pos[:10], neg[:10]), (pos[10:], neg[10:])]  # unequal shares
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_trainer, args=(r, port, *shares[r], out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    expected = link_metrics(pos, neg, hits=(1, 5))
    for r in range(2):
        assert results[r] == pytest.approx(expected)


def test_held_out_metrics_score_each_share_of_the_pairs_against_its_negatives():
    rng = np.random.default_rng(0)
    table = torch.from_numpy(rng.standard_normal((40, 8)).astype(np.float32))
    held_out = {"val_pairs": np.zeros((0, 2), np.int64), "val_negatives": np.zeros((0, 5), np.int64)}
    held_out.update(test_pairs=rng.integers(0, 40, (23, 2)), test_negatives=rng.integers(0, 40, (23, 5)))
    looked_up = []

    def embed(ids: np.ndarray) -> torch.Tensor:
        looked_up.append(len(ids))
        assert (np.diff(ids) > 0).all()  # sorted, each node once
        return table[torch.from_numpy(ids)]

    def direct(pairs: np.ndarray, negatives: np.ndarray) -> dict[str, float]:
        src, dst, neg = table[pairs[:, 0]], table[pairs[:, 1]], table[negatives]
        return link_metrics((src * dst).sum(-1), (src[:, None] * neg).sum(-1), hits=(1, 10, 50))

    # 20 rows per step are 2 pairs (each with 5 negatives): 12 steps, the empty val split left out.
    got = held_out_metrics(embed, DotPredictor(), held_out, rows_per_step=20)
    assert len(looked_up) == 12 and max(looked_up) <= 14
    expected = direct(held_out["test_pairs"], held_out["test_negatives"])
    assert got.keys() == {f"test_{k}" for k in expected}
    for key, value in expected.items():
        assert got[f"test_{key}"] == pytest.approx(value)
    # Trainer 1 of 2 scores the second share (in one process the metrics are its own).
    second = held_out_metrics(embed, DotPredictor(), held_out, rank=1, world_size=2)
    assert second["test_num_pairs"] == 11
    assert second["test_mrr"] == pytest.approx(
        direct(held_out["test_pairs"][12:], held_out["test_negatives"][12:])["mrr"]
    )
