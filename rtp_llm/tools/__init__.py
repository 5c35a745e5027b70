"""Command-line tools over the engine: compare (layer-by-layer parity between two sides)."""
