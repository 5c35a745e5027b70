"""Model definitions, the checkpoint loader, the architecture registry and the tensor-parallel shard plan."""
