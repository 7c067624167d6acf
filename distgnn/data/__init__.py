"""Graphs for distgnn: the in-memory ``Graph`` and ``HeteroGraph``, the readers and generators that produce
them, link splits, and datasets by name (``datasets``). May import: errors.
"""

from distgnn.data.graph import Graph
from distgnn.data.npz import load_npz
from distgnn.data.planetoid import PLANETOID_NAMES, load_planetoid
from distgnn.data.synthetic import synthetic
from distgnn.data.synthetic_mag import synthetic_mag

__all__ = ["PLANETOID_NAMES", "Graph", "load_npz", "load_planetoid", "synthetic", "synthetic_mag"]
