from distgnn.data.graph import Graph

__all__ = ["Graph"]
