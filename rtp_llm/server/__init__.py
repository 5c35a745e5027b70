"""The HTTP server: OpenAI-compatible and RTP-LLM native routes, metrics, auth."""
