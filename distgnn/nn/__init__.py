"""distgnn.nn: pure-torch GNN layers and models that run on Blocks."""

from distgnn.nn.conv import GATConv, SAGEConv
from distgnn.nn.hetero import RGCN, RelGraphConv, TypedInput
from distgnn.nn.models import GAT, MLP, GraphSAGE

__all__ = ["GAT", "MLP", "RGCN", "GATConv", "GraphSAGE", "RelGraphConv", "SAGEConv", "TypedInput"]
