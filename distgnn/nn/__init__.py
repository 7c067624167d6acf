"""distgnn.nn (see DESIGN.md)."""
