"""distgnn.nn: pure-torch GNN layers and models that run on Blocks, link prediction heads, block conversion
for DGL and PyG. May import: errors, native, data, partition, sampling, client.
"""

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.hetero import RGCN, RelGraphConv, TypedInput
from distgnn.nn.link import DotPredictor, MLPPredictor, TypedPredictor, bce_loss, margin_loss, score_pairs
from distgnn.nn.models import GAT, MLP, GraphSAGE
from distgnn.nn.recurrent import GCLSTM, EvolveGCNO, GConvGRU, SnapshotModel

__all__ = [
    "GAT",
    "MLP",
    "RGCN",
    "GCLSTM",
    "EvolveGCNO",
    "GConvGRU",
    "SnapshotModel",
    "DotPredictor",
    "GATConv",
    "GraphSAGE",
    "MLPPredictor",
    "RelGraphConv",
    "SAGEConv",
    "TypedInput",
    "TypedPredictor",
    "bce_loss",
    "margin_loss",
    "score_pairs",
]
