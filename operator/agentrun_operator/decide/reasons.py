"""Phases and the one list of reasons: every ``status.reason`` the operator writes is a ``Reason``.

The CRD's description of ``status.reason`` lists exactly these values
(tests/unit/test_operator_reasons.py fails when the two differ), so
``kubectl explain`` never promises a reason that cannot appear. Events reuse
the same words; the one exception is a disruption Event, whose reason is
the cluster's own word for what happened to the pod (``DisruptionReason``
names the ones the operator coins itself).
"""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """An AgentRun's phase (``status.phase``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    INTERRUPTED = "Interrupted"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL = frozenset({Phase.STOPPED, Phase.SUCCEEDED, Phase.FAILED})


class Reason(enum.StrEnum):
    """Why a run is in its phase (``status.reason``, the condition reason and the Event reason)."""

    # Pending
    POD_CREATED = "PodCreated"  # an attempt's pod was created
    BACK_OFF = "BackOff"  # a crash; the next attempt waits for its backoff
    THREAD_BUSY = "ThreadBusy"  # another live AgentRun holds the thread: this one waits
    # Pending: the store did not answer (runner exit 8 or the operator's own read); Failed: past
    # spec.restartPolicy.storeUnavailableTimeoutSeconds counted from the first unavailability.
    STORE_UNAVAILABLE = "StoreUnavailable"
    # Running, Interrupted, Stopping
    RUNNING = "Running"
    INTERRUPTED = "Interrupted"
    STOP_REQUESTED = "StopRequested"
    # Succeeded
    COMPLETED = "Completed"
    ALREADY_COMPLETED = "AlreadyCompleted"  # the request key's turn completed earlier: no pod, the recorded result
    # Stopped
    STOPPED = "Stopped"
    STOPPED_BEFORE_START = "StoppedBeforeStart"
    FORCED_STOP = "ForcedStop"
    # Failed
    RUN_FAILED = "RunFailed"  # the runner failed permanently (exit 5); the message has its error code
    SUPERSEDED = "Superseded"  # exit 7 of the current pod: another AgentRun claimed the thread
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DISRUPTION_LIMIT_EXCEEDED = "DisruptionLimitExceeded"
    INVALID_SPEC = "InvalidSpec"
    TOOL_ERROR = "ToolError"  # a tool call failed and spec.config.failOnToolError is true (TOOL_ERROR_001)
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # the run outlived spec.activeDeadlineSeconds (from startTime)
    STORE_SECRET_NOT_FOUND = "StoreSecretNotFound"
    STORE_SECRET_INVALID = "StoreSecretInvalid"
    INVALID_STORE = "InvalidStore"  # malformed DSN, authentication failed, database missing (STORAGE_CONFIG_001)
    # Failed: the kubelet could not create the runner container (its own words, passed through).
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    INVALID_IMAGE_NAME = "InvalidImageName"
    START_ERROR = "StartError"  # the container process could not be started (exit 128)
    ERR_IMAGE_PULL = "ErrImagePull"  # still pulling past spec.restartPolicy.imagePullTimeoutSeconds
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"


# A kubelet reports these when the container cannot even be created: retrying will not help.
CONFIG_ERRORS = frozenset(
    {Reason.CREATE_CONTAINER_CONFIG_ERROR, Reason.CREATE_CONTAINER_ERROR, Reason.INVALID_IMAGE_NAME}
)


class DisruptionReason(enum.StrEnum):
    """Disruption Event reasons (and reschedule metric labels) the operator coins; never a status reason.

    Other disruptions carry the cluster's reason (``EvictionByEvictionAPI``, ``PreemptionByScheduler``,
    ``Evicted``, ...) from the pod's ``DisruptionTarget`` condition or ``status.reason``.
    """

    NODE_LOST = "NodeLost"
    POD_DELETED = "PodDeleted"
    PREEMPTED = "Preempted"  # exit 6 without a condition: the runner got SIGTERM and checkpointed


class RescheduleReason(enum.StrEnum):
    """Why an attempt follows another besides a crash or a disruption (the reschedule metric's label)."""

    RETRY = "Retry"  # spec.retry re-opened a Failed run
    RESUME = "Resume"  # spec.resume answered an interrupt
