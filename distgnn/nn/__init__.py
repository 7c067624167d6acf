"""distgnn.nn: pure-torch GNN layers and models that run on Blocks."""

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.models import GAT, MLP, GraphSAGE

__all__ = ["GAT", "MLP", "GATConv", "GraphSAGE", "SAGEConv"]
