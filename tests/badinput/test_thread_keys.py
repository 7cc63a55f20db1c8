"""Store-level thread ids are namespaced and cannot collide across namespaces (issue 13, security).

The operator hands the runner ``<namespace>/<threadId>`` (``decide.spec.thread_key``); the store
knows nothing else about namespaces. A namespace is a DNS label (no ``/``) and the CRD's threadId
pattern admits no ``/`` either, so the first ``/`` of a key splits it back uniquely: no pair of
(namespace, threadId) can name another pair's thread, and every key fits the store's 253 characters.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.checkpoint.postgres import check_thread_id
from agentrun_operator.decide.spec import thread_key

pytestmark = pytest.mark.unit

CRD = yaml.safe_load((Path(__file__).parents[2] / "crds" / "agentrun.dev_agentruns.yaml").read_text())
SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
THREAD = SPEC["threadId"]
namespaces = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
thread_ids = st.from_regex(re.compile(THREAD["pattern"].replace("^", r"\A").replace("$", r"\Z"))).filter(
    lambda t: THREAD["minLength"] <= len(t) <= THREAD["maxLength"]
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(a=st.tuples(namespaces, thread_ids), b=st.tuples(namespaces, thread_ids))
def test_two_namespaces_never_share_a_thread_key(a: tuple[str, str], b: tuple[str, str]) -> None:
    assert (thread_key(*a) == thread_key(*b)) == (a == b), f"{a} and {b} name the same thread"
    namespace, _, thread = thread_key(*a).partition("/")
    assert (namespace, thread) == a, "the key does not split back into its namespace and threadId"


@settings(max_examples=100, derandomize=True, deadline=None)
@given(namespace=namespaces, thread=thread_ids)
def test_every_key_fits_the_store(namespace: str, thread: str) -> None:
    check_thread_id(thread_key(namespace, thread))  # raises ValueError past 253 characters


def test_the_crd_admits_no_slash_in_a_thread_id() -> None:
    pattern = re.compile(THREAD["pattern"])
    for sneaky in ("team-a/secret", "../team-a/secret", "a/b", "/x"):
        assert not pattern.match(sneaky), f"threadId {sneaky!r} would reach into another namespace's keys"
