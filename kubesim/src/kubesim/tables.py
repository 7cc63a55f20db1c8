"""Server-side ``meta.k8s.io/v1 Table`` rendering, the format ``kubectl get`` asks for.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints
whatever columns the server returns; that is how a CRD's
``additionalPrinterColumns`` reach the terminal. Custom resources follow the
apiextensions table convertor (JSONPath cells typed by the column type, ``date``
cells rendered as an age); pods and events follow kubectl's built-in printers
closely enough that ``kubectl get pods`` reads like on a real cluster.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubesim.resources import ResourceDef


@dataclass(frozen=True)
class Column:
    """A printer column (``additionalPrinterColumns`` or a built-in's table column)."""

    name: str
    type: str
    json_path: str = ""
    description: str = ""
    priority: int = 0
    format: str = ""
    compute: Callable[[dict[str, Any]], Any] | None = None


def wants_table(accept: str) -> bool:
    """True when the client prefers a meta.k8s.io/v1 Table (the first acceptable media type)."""
    for media in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[-1].strip() for p in media.split(";")[1:]}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", None):
            return True
        if media.strip().startswith(("application/json", "*/*")) and "as" not in params:
            return False
    return False


def render(
    rdef: ResourceDef,
    objects: list[dict[str, Any]],
    *,
    resource_version: str,
    include_object: str = "Metadata",
    continue_token: str | None = None,
) -> dict[str, Any]:
    """A ``meta.k8s.io/v1 Table`` of ``objects`` with ``rdef``'s columns."""
    columns = rdef.columns
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": c.name,
                "type": "string" if c.type == "date" and not rdef.custom else c.type,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            }
            for c in columns
        ],
        "rows": [row(rdef, obj, include_object) for obj in objects],
    }
    if continue_token:
        table["metadata"]["continue"] = continue_token
    return table


def row(rdef: ResourceDef, obj: dict[str, Any], include_object: str = "Metadata") -> dict[str, Any]:
    """One table row of ``obj`` (with the object as ``include_object`` asks: None, Metadata or Object)."""
    cells = [cell(col, obj) for col in rdef.columns]
    result: dict[str, Any] = {"cells": cells}
    if include_object == "Object":
        result["object"] = obj
    elif include_object != "None":
        result["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {}),
        }
    return result


def cell(col: Column, obj: dict[str, Any]) -> Any:
    """One cell of ``obj`` for ``col``: computed, or its JSON path's value typed by the column."""
    if col.compute is not None:
        return col.compute(obj)
    if col.format == "name" and not col.json_path:
        return obj.get("metadata", {}).get("name")
    values = list(jsonpath(obj, col.json_path))
    if not values or values[0] is None:
        return None
    value = values[0]
    match col.type:
        case "date":
            return age(value)
        case "integer":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        case "number":
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None
        case "boolean":
            return value if isinstance(value, bool) else None
        case _:
            return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


_STEP = re.compile(
    r"""\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\['([^']+)'\]"""
    r"""|\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*["']([^"']*)["']\)\]"""
)


def jsonpath(obj: Any, path: str) -> Iterator[Any]:
    """The subset of kubectl JSONPath used by printer columns: ``.a.b``, ``[0]``, ``[?(@.k=="v")]``."""
    current = [obj]
    pos = 0
    path = path.strip().removeprefix("{").removesuffix("}")
    while pos < len(path):
        match = _STEP.match(path, pos)
        if match is None:
            return
        pos = match.end()
        field, index, quoted, filter_key, filter_value = match.groups()
        nxt: list[Any] = []
        for item in current:
            if (field or quoted) and isinstance(item, dict) and (field or quoted) in item:
                nxt.append(item[field or quoted])
            elif index is not None and isinstance(item, list) and int(index) < len(item):
                nxt.append(item[int(index)])
            elif filter_key and isinstance(item, list):
                for element in item:
                    probe = list(jsonpath(element, "." + filter_key))
                    if probe and str(probe[0]) == filter_value:
                        nxt.append(element)
        current = nxt
    yield from current


def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """``duration.HumanDuration`` of the time since the timestamp, as kubectl prints ages."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    now = now or datetime.datetime.now(datetime.UTC)
    seconds = int((now - then).total_seconds())
    return human_duration(seconds)


def human_duration(seconds: int) -> str:
    """A duration as kubectl shows an age (``5s``, ``3m2s``, ``4h``, ``2d``, ``3y``)."""
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m" if seconds % 60 == 0 else f"{minutes}m{seconds % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return f"{days // 365}y" if days % 365 == 0 else f"{days // 365}y{days % 365}d"
    return f"{hours // 24 // 365}y"


# --- built-in printers ---------------------------------------------------------------------------


def pod_columns() -> list[Column]:
    """The columns of ``kubectl get pods`` (name, ready, status, restarts, age, ...)."""

    def ready(pod: dict[str, Any]) -> str:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        total = len(pod.get("spec", {}).get("containers") or [])
        return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"

    def restarts(pod: dict[str, Any]) -> str:
        return str(sum(s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses") or []))

    def created_age(obj: dict[str, Any]) -> str:
        return age(obj.get("metadata", {}).get("creationTimestamp"))

    return [
        Column("Name", "string", "", "Name must be unique within a namespace.", 0, "name"),
        Column(
            "Ready",
            "string",
            description="The aggregate readiness state of this pod for accepting traffic.",
            compute=ready,
        ),
        Column(
            "Status", "string", description="The aggregate status of the containers in this pod.", compute=pod_status
        ),
        Column(
            "Restarts",
            "string",
            description="The number of times the containers in this pod have been "
            "restarted and when the last container in this pod has restarted.",
            compute=restarts,
        ),
        Column(
            "Age",
            "string",
            description="CreationTimestamp is a timestamp representing the server time when this object was created.",
            compute=created_age,
        ),
        Column("IP", "string", ".status.podIP", "IP address allocated to the pod.", 1),
        Column("Node", "string", ".spec.nodeName", "Name of the node assigned to the pod.", 1),
    ]


def pod_status(pod: dict[str, Any]) -> str:
    """The STATUS column of ``kubectl get pods`` (kubectl's printPod, without init containers)."""
    status = pod.get("status", {})
    reason = status.get("reason") or status.get("phase") or "Unknown"
    has_running = False
    for container in reversed(status.get("containerStatuses") or []):
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            reason = (
                f"Signal:{terminated['signal']}"
                if terminated.get("signal")
                else f"ExitCode:{terminated.get('exitCode', 0)}"
            )
        elif container.get("ready") and "running" in state:
            has_running = True
    if reason == "Completed" and has_running:
        reason = "Running"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def event_columns() -> list[Column]:
    """The columns of ``kubectl get events``."""

    def last_seen(event: dict[str, Any]) -> str:
        stamp = (
            event.get("lastTimestamp") or event.get("eventTime") or event.get("metadata", {}).get("creationTimestamp")
        )
        return age(stamp)

    def involved(event: dict[str, Any]) -> str:
        ref = event.get("involvedObject") or {}
        return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"

    text: Callable[[str], Column] = lambda name: Column(name.title(), "string", f".{name}")  # noqa: E731
    return [
        Column("Last Seen", "string", compute=last_seen),
        text("type"),
        text("reason"),
        Column("Object", "string", compute=involved),
        text("message"),
        Column("Count", "integer", ".count", priority=1),
        Column("Name", "string", ".metadata.name", priority=1, format="name"),
    ]


def node_status(node: dict[str, Any]) -> str:
    """A node's status column (``Ready``, ``NotReady``, ``Unknown``)."""
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"
