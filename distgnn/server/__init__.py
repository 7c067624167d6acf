"""distgnn.server (see DESIGN.md)."""
