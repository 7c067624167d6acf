"""Graphs for distgnn: the in-memory ``Graph`` and the loaders that produce it."""

from distgnn.data.graph import Graph
from distgnn.data.npz import load_npz
from distgnn.data.planetoid import PLANETOID_NAMES, load_planetoid
from distgnn.data.synthetic import synthetic

__all__ = ["PLANETOID_NAMES", "Graph", "load_npz", "load_planetoid", "synthetic"]
