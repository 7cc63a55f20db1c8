"""Unit tier: the runtime in one process with the in-memory and SQLite (tmp file) checkpointers.

No network, no subprocesses. Deadline and stop logic use looptime to
fast-forward asyncio time instead of sleeping.

Tests that take the ``backend``/``checkpointer`` fixtures (tests/conftest.py)
run once per backend. The PostgreSQL parameter of those fixtures carries the
``postgres`` tier, not this one: ``pytest -m unit`` leaves it out, and it skips
(saying why) when the server or ``agentrun.checkpoint.postgres`` is missing.
"""
