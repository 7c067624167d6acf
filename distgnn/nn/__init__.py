"""distgnn.nn: pure-torch GNN layers and models that run on Blocks."""

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.models import GAT, GraphSAGE

__all__ = ["GAT", "GATConv", "GraphSAGE", "SAGEConv"]
