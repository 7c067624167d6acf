"""Link prediction heads: scorers broadcast over pairs, losses against hand-written formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distgnn.errors import InputError
from distgnn.loader.edge import PairGraph
from distgnn.nn import DotPredictor, MLPPredictor, bce_loss, margin_loss, score_pairs


def test_dot_predictor_scores_pairs_and_broadcasts():
    torch.manual_seed(0)
    h = torch.randn(6, 4)
    pairs = PairGraph(torch.tensor([0, 2, 5]), torch.tensor([1, 2, 3]), torch.arange(6))
    scores = score_pairs(DotPredictor(), h, pairs)
    torch.testing.assert_close(scores, torch.stack([h[0] @ h[1], h[2] @ h[2], h[5] @ h[3]]))
    many = DotPredictor()(h[:2, None, :], h[None, 2:, :])  # (2, 1, d) x (1, 4, d)
    torch.testing.assert_close(many, h[:2] @ h[2:].T)


def test_mlp_predictor_is_an_mlp_of_the_product():
    torch.manual_seed(1)
    mlp = MLPPredictor(4, hidden=8, num_layers=2)
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    first, second = mlp.layers
    expected = second(F.relu(first(a * b))).squeeze(-1)
    torch.testing.assert_close(mlp(a, b), expected)
    assert mlp(a[:, None], torch.randn(5, 3, 4)).shape == (5, 3)
    with pytest.raises(InputError, match="num_layers"):
        MLPPredictor(4, num_layers=0)


def test_losses():
    pos, neg = torch.tensor([2.0, -1.0]), torch.tensor([0.5, -0.5, 3.0, 1.0])
    expected_bce = -(F.logsigmoid(pos).sum() + F.logsigmoid(-neg).sum()) / 6
    torch.testing.assert_close(bce_loss(pos, neg), expected_bce)
    # Positive 0 against [0.5, -0.5], positive 1 against [3.0, 1.0], margin 1.
    hinge = torch.tensor([max(0.0, 1 - 2 + 0.5), max(0.0, 1 - 2 - 0.5), max(0.0, 1 + 1 + 3), max(0.0, 1 + 1 + 1)])
    torch.testing.assert_close(margin_loss(pos, neg), hinge.mean())
    with pytest.raises(InputError, match="k negatives"):
        margin_loss(pos, torch.zeros(3))
