"""Model definitions, the checkpoint loader and the architecture registry."""
