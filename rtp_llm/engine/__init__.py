"""Running models: the ModelRunner (one forward per step on the paged cache) and generation loops."""
