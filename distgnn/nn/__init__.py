"""distgnn.nn: pure-torch GNN layers and models that run on Blocks, and link prediction heads."""

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.link import DotPredictor, MLPPredictor, bce_loss, margin_loss, score_pairs
from distgnn.nn.models import GAT, MLP, GraphSAGE

__all__ = [
    "GAT",
    "MLP",
    "DotPredictor",
    "GATConv",
    "GraphSAGE",
    "MLPPredictor",
    "SAGEConv",
    "bce_loss",
    "margin_loss",
    "score_pairs",
]
