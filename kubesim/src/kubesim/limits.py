"""The size and nesting limits of a real API server, and what the emulator needs to honour them.

A test of hostile objects proves nothing if the emulator refuses less (or more)
than a real server, so these follow the real limits and messages:

- Request bodies: kube-apiserver reads at most 3 MiB (``MaxRequestBodyBytes``,
  3145728: twice etcd's limit, since JSON shrinks when stored) and answers a
  larger one ``413 RequestEntityTooLarge``, "Request entity too large: limit is
  3145728".
- Stored objects: etcd refuses a request over ``--max-request-bytes`` (1.5 MiB
  by default) with "etcdserver: request is too large", which kube-apiserver 1.32
  passes on as a ``500`` Status without a reason (kubernetes/kubernetes#112152).
  The emulator measures the object's compact JSON plus its etcd key; real
  servers store built-in kinds as protobuf, a little smaller than JSON, so the
  emulator is slightly stricter for them (custom resources are stored as JSON).
- Nesting: Go's JSON decoder (``maxNestingDepth``, used by kube-apiserver through
  ``sigs.k8s.io/json``) refuses a document nested deeper than 10,000 levels
  ("exceeded max depth"). The depth counts the whole request body: an
  AgentRun's ``spec.input`` can nest 9,997 levels (the object, ``spec`` and
  ``input`` are three). A watch event wraps the object in one more level.

Python's JSON, ``copy.deepcopy``, equality, YAML and merge-patch code recurse
once or a few times per level, and the default recursion limit (1000) would
turn a 10,000-level object that a real server stores into a RecursionError
(a 500 from the emulator, or a broken watch). ``raise_recursion_limit`` lifts
the interpreter's limit to ``RECURSION_LIMIT`` (six frames per level for
10,000 levels), which the emulator's code paths were measured to stay within
on an 8 MiB thread stack; bodies deeper than 10,000 levels are refused by an
iterative scan before anything recursive sees them. The limit is process-wide:
an infinite recursion elsewhere in the same test process is caught later
(60,000 frames instead of 1,000).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from typing import Any

from kubesim.apierrors import ApiError

MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
MAX_STORED_BYTES = 1536 * 1024  # etcd --max-request-bytes default (1.5 MiB)
MAX_JSON_DEPTH = 10_000
RECURSION_LIMIT = 60_000

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]+")


def raise_recursion_limit() -> None:
    """Let the emulator handle the 10,000 levels a real server accepts (see the module docstring)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


def too_deep(body: bytes) -> bool:
    """Whether a JSON document nests objects and arrays deeper than Go's decoder accepts (iterative)."""
    if body.count(b"{") + body.count(b"[") <= MAX_JSON_DEPTH:
        return False  # fewer openings than the limit: it cannot be deeper
    brackets = _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", body))
    steps = (1 if c in b"{[" else -1 for c in brackets)
    return max(itertools.accumulate(steps, initial=0)) > MAX_JSON_DEPTH


def request_too_large() -> ApiError:
    """413 RequestEntityTooLarge (a body over the API server's limit)."""
    return ApiError(
        status=413,
        reason="RequestEntityTooLarge",
        message=f"Request entity too large: limit is {MAX_REQUEST_BODY_BYTES}",
    )


def too_deep_error(kind: str | None, body: bytes) -> ApiError:
    """What kube-apiserver answers for a body its JSON decoder refuses (transformDecodeError)."""
    summary = body[:30].decode(errors="replace") + (" ..." if len(body) > 30 else "")
    target = f" (must be of type {kind})" if kind else ""
    return ApiError(
        status=400,
        reason="BadRequest",
        message=f"the object provided is unrecognized{target}: couldn't get version/kind; "
        f"json parse error: exceeded max depth ({summary})",
    )


def stored_size(obj: dict[str, Any], key: str) -> int:
    """The bytes an object takes in etcd here: its compact JSON and its key."""
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()) + len(key.encode())


def too_large_for_etcd() -> ApiError:
    """The 500 etcd's size limit gives a too large object."""
    return ApiError(status=500, reason=None, message="etcdserver: request is too large")
