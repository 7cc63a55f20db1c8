"""Unit tier: the runtime in one process with the in-memory and SQLite (tmp file) checkpointers.

No network, no subprocesses. Deadline and backoff logic use looptime to
fast-forward asyncio time instead of sleeping.
"""
