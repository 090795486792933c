"""Camera sources, one module per kind, all with the same interface."""
