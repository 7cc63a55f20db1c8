"""Pods that cannot start (pure): the kubelet's own reason and message in, a Failed verdict out.

- ``StartError`` (the container ``terminated`` with exit 128: the runtime could not exec the
  process, e.g. an environment over the kernel's limits): Failed at once, a retry starts the same
  process the same way;
- ``CreateContainerConfigError``, ``CreateContainerError``, ``InvalidImageName`` (``waiting``): Failed
  at once (see ``reasons.CONFIG_ERRORS``; the kubelet already retries these itself while we look);
- ``ErrImagePull`` / ``ImagePullBackOff`` (``waiting``): the kubelet retries pulls with its own backoff,
  and a registry hiccup heals, so these fail only once the pod has waited for its image longer than
  ``spec.restartPolicy.imagePullTimeoutSeconds`` (counted from the pod's creation).

The status message is ``"<kubelet reason>: <kubelet message>"`` on one line.
"""

from __future__ import annotations

from datetime import datetime

from .classify import START_ERRORS, PodView
from .messages import one_line
from .reasons import Reason

IMAGE_PULL = frozenset({Reason.ERR_IMAGE_PULL.value, Reason.IMAGE_PULL_BACK_OFF.value})


def kubelet_message(reason: str, message: str | None, fallback: str) -> str:
    """A kubelet's reason and message on one line (``fallback`` when it gave no message)."""
    return one_line(f"{reason}: {message or fallback}")


def start_error(pod: PodView) -> tuple[Reason, str] | None:
    """A container that ended because it could not be started at all."""
    if pod.terminated_reason not in START_ERRORS:
        return None
    return Reason.START_ERROR, kubelet_message(
        pod.terminated_reason or "StartError",
        pod.termination_message,
        f"the runner process could not be started (exit {pod.exit_code})",
    )


def image_pull_timed_out(pod: PodView, *, now: datetime, timeout: float) -> tuple[Reason, str] | None:
    """A pod still waiting for its image ``timeout`` seconds after it was created."""
    if pod.waiting_reason not in IMAGE_PULL or pod.created is None:
        return None
    waited = (now - pod.created).total_seconds()
    if waited < timeout:
        return None
    reason = Reason(pod.waiting_reason)
    detail = f"{pod.waiting_message or 'the image could not be pulled'} (still not pulled after {waited:.0f}s"
    return reason, one_line(f"{reason}: {detail}; spec.restartPolicy.imagePullTimeoutSeconds is {timeout:g})")
