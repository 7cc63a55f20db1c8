"""One list of reasons and one status shape, shared by the operator and the CRD (what ``kubectl explain`` shows).

The CRD's description of ``status.reason`` must list exactly the ``Reason``
values the decisions use: a reason promised there but never written (the
old ``GraphNotFound``) or written but never documented breaks users' alerts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agentrun_operator.decide.reasons import Reason
from agentrun_operator.decide.status import AgentRunStatus, StatusPatch

CRD = Path(__file__).resolve().parents[2] / "crds" / "agentrun.dev_agentruns.yaml"


def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_the_crd_lists_exactly_the_reasons_the_operator_writes() -> None:
    description = status_schema()["properties"]["reason"]["description"]
    listed = description.split("one of:", 1)[1]
    documented = set(re.findall(r"[A-Z][A-Za-z]+", listed))
    assert documented == {r.value for r in Reason}, (
        "status.reason in the CRD must list exactly agentrun_operator.decide.reasons.Reason: "
        f"documented but never written {sorted(documented - {r.value for r in Reason})}, "
        f"written but undocumented {sorted({r.value for r in Reason} - documented)}"
    )


def test_no_crd_description_promises_a_reason_that_does_not_exist() -> None:
    text = CRD.read_text()
    for promised in re.findall(r"(?:with |Failed with )?reason ([A-Z][A-Za-z]+)", text):
        assert promised in {r.value for r in Reason}, f"the CRD promises reason {promised}, which is never written"


def test_the_status_model_the_patch_and_the_crd_name_the_same_fields() -> None:
    model = {info.alias or name for name, info in AgentRunStatus.model_fields.items()}
    patch = set(StatusPatch.__annotations__)
    crd = set(status_schema()["properties"])
    assert model == patch, "AgentRunStatus (read) and StatusPatch (written) must name the same status fields"
    assert model <= crd, f"status fields the CRD does not declare (the API server would prune them): {model - crd}"


def test_the_status_reads_back_as_written_and_absent_fields_stay_absent() -> None:
    raw = {"phase": "Running", "attempt": 1, "lastCheckpointTime": "2025-03-01T12:00:00Z", "stateVersion": 3}
    assert AgentRunStatus.parse(raw).wire() == raw, "a default (restarts 0) must not read as written"
    assert AgentRunStatus.parse({"attempt": "many", "phase": "Running"}).wire() == {"phase": "Running"}, (
        "a field that does not parse reads as unset instead of wedging the run"
    )


def test_the_crd_default_status_reads_as_a_run_the_operator_has_not_seen() -> None:
    schema = status_schema()
    assert schema["default"] == {} and schema["properties"]["phase"]["default"] == "Pending"
    assert AgentRunStatus.parse({"phase": "Pending"}).phase is None, "the API server's default is not a decision"
    assert AgentRunStatus.parse({"phase": "Pending", "reason": "PodCreated"}).phase == "Pending"
