"""Decoding the Kubernetes protobuf bodies kubectl sends for a few built-in kinds.

``kubectl create namespace|secret|configmap|serviceaccount`` post
``application/vnd.kubernetes.protobuf`` (a ``k8s\\0`` magic, then a
``runtime.Unknown`` wrapping the object's generated protobuf), not JSON. The
emulator decodes the kinds a user of AgentRun creates this way (Namespace,
Secret, ConfigMap, ServiceAccount, with ObjectMeta and owner references) and
the ``DeleteOptions`` client-go sends with a delete into their JSON form; any
other kind over protobuf is answered 415 (send JSON).
Field numbers are those of the upstream ``generated.proto`` files.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# message -> {field number: (json name, kind)}; kind: str, bytes, int, bool, time, a message name,
# "map:<value kind>" or "list:<kind>".
_MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta"),
        2: ("raw", "raw"),
        3: ("contentEncoding", "str"),
        4: ("contentType", "str"),
    },
    "TypeMeta": {1: ("apiVersion", "str"), 2: ("kind", "str")},
    "ObjectMeta": {
        1: ("name", "str"),
        2: ("generateName", "str"),
        3: ("namespace", "str"),
        5: ("uid", "str"),
        6: ("resourceVersion", "str"),
        7: ("generation", "int"),
        8: ("creationTimestamp", "time"),
        11: ("labels", "map:str"),
        12: ("annotations", "map:str"),
        13: ("ownerReferences", "list:OwnerReference"),
        14: ("finalizers", "list:str"),
    },
    "OwnerReference": {
        1: ("kind", "str"),
        3: ("name", "str"),
        4: ("uid", "str"),
        5: ("apiVersion", "str"),
        6: ("controller", "bool"),
        7: ("blockOwnerDeletion", "bool"),
    },
    "Time": {1: ("seconds", "int"), 2: ("nanos", "int")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "list:str")},
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map:bytes"),
        3: ("type", "str"),
        4: ("stringData", "map:str"),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map:str"),
        3: ("binaryData", "map:bytes"),
        4: ("immutable", "bool"),
    },
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 4: ("automountServiceAccountToken", "bool")},
    # client-go sends these with a DELETE (Helm's uninstall deletes its release Secrets so)
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int"),
        2: ("preconditions", "Preconditions"),
        3: ("orphanDependents", "bool"),
        4: ("propagationPolicy", "str"),
        5: ("dryRun", "list:str"),
    },
    "Preconditions": {1: ("uid", "str"), 2: ("resourceVersion", "str")},
}
SUPPORTED_KINDS = ("Namespace", "Secret", "ConfigMap", "ServiceAccount", "DeleteOptions")


class ProtobufError(ValueError):
    """A protobuf body that cannot be decoded."""


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded Namespace, Secret or ConfigMap."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf magic prefix")
    unknown = _message(body[len(MAGIC) :], "Unknown")
    type_meta = unknown.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if kind not in SUPPORTED_KINDS:
        raise ProtobufError(f"protobuf bodies of kind {kind!r} are not supported by the emulator; send JSON")
    obj = _message(unknown.get("raw", b""), kind)
    return {"apiVersion": type_meta.get("apiVersion", "v1"), "kind": kind, **obj}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            fields.append((number, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            fields.append((number, data[pos : pos + length]))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return fields


def _message(data: bytes, name: str) -> dict[str, Any]:
    spec = _MESSAGES[name]
    obj: dict[str, Any] = {}
    for number, raw in _fields(data):
        if number not in spec:
            continue  # fields the emulator does not need (status, managedFields, ...)
        field, kind = spec[number]
        if kind.startswith("map:"):
            entry = dict(_fields(raw if isinstance(raw, bytes) else b""))
            key = _scalar(entry.get(1, b""), "str")
            obj.setdefault(field, {})[key] = _scalar(entry.get(2, b""), kind[4:])
        elif kind.startswith("list:"):
            obj.setdefault(field, []).append(_scalar(raw, kind[5:]))
        else:
            obj[field] = _scalar(raw, kind)
    return obj


def _scalar(raw: int | bytes, kind: str) -> Any:
    if kind == "int":
        return int(raw) if isinstance(raw, int) else 0
    if kind == "bool":
        return bool(raw)
    data = raw if isinstance(raw, bytes) else b""
    if kind == "raw":
        return data
    if kind == "str":
        return data.decode()
    if kind == "bytes":
        return base64.b64encode(data).decode()
    if kind == "time":
        seconds = _message(data, "Time").get("seconds", 0)
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _message(data, kind)
