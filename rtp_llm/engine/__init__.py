"""The engine, split by role: the core's step (core.py: scheduler -> model runner -> output processor), the input
processor the callers run, and the client that drives a core on a thread or in a process of its own."""
