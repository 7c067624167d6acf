"""distgnn.cache (see DESIGN.md)."""
