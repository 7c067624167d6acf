"""distgnn.rpc (see DESIGN.md)."""
