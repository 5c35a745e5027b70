"""Model building blocks: norms, rotary embedding, attention backends."""
