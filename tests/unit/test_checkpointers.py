"""The store contract (``tests/support/checkpointer_contract.py``) against every backend of this tier.

The ``backend``/``checkpointer`` fixtures (``tests/conftest.py``) give each test every store: memory,
SQLite and PostgreSQL. The suite lives in a support module because ``tests/postgres`` runs it again
with the Redis hot cache on.
"""

from __future__ import annotations

from tests.support import checkpointer_contract as suite

globals().update({name: test for name, test in vars(suite).items() if name.startswith("test_")})
