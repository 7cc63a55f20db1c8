"""``agentrun``'s names are imported on first use (runner/agentrun/__init__.py).

Protected: every public name still resolves (``from agentrun import X`` for each of ``__all__``), and a process
that reads only ``agentrun.contract`` (the operator, ``kubectl agentrun``, the history server) loads neither the
engine, the messages' models nor a store. Each check runs in a new interpreter: this test process has imported
everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import agentrun


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    import importlib

    for name in agentrun.__all__:
        value = getattr(agentrun, name)
        module = importlib.import_module(agentrun._EXPORTS[name], "agentrun")
        assert value is getattr(module, name), name
    assert set(agentrun.__all__) == set(agentrun._EXPORTS)
    assert set(agentrun.__all__) <= set(dir(agentrun))


def test_reading_the_contract_loads_neither_the_engine_nor_the_messages_nor_a_store() -> None:
    loaded = _modules_after("import agentrun.contract")
    heavy = {"agentrun.engine", "agentrun.messages", "agentrun.checkpoint", "asyncpg", "redis"}
    assert not heavy & loaded, sorted(heavy & loaded)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        agentrun.NoSuchName  # noqa: B018
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:
        raise AssertionError("agentrun.NoSuchName resolved")
