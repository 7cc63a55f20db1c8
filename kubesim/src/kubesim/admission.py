"""What the real API server does to built-in objects beyond storing them.

Registry strategies (defaults on create, what an update may change) and the
admission plugins an operator's pods meet on every cluster:

- Pods: the API defaults (``restartPolicy: Always``!, grace period 30 s,
  ``status.phase: Pending``), the ServiceAccount admission (a
  ``kube-api-access-*`` token volume unless ``automountServiceAccountToken:
  false``), Pod Security admission for namespaces labelled
  ``pod-security.kubernetes.io/enforce`` / ``warn`` (baseline and restricted
  checks of the "latest" policy), and the rule that a pod's spec is immutable
  except for images, ``activeDeadlineSeconds``, added tolerations and the grace
  period.
- Secrets: ``stringData`` is merged into base64 ``data``.
- Namespaces: ``status.phase: Active`` and the ``kubernetes`` finalizer.
- Services: the API defaults (``type: ClusterIP``, ``sessionAffinity``,
  ``internalTrafficPolicy``, a port's ``protocol`` and ``targetPort``), a
  cluster IP from 10.96.0.0/12 (random, not checked for reuse: a test needs a
  few), single-stack IPv4; an update without them keeps the allocated IPs.
- Every object: its annotations together at most 256 KiB (ObjectMeta validation).
"""

from __future__ import annotations

import base64
import copy
import random
import re
import string
from typing import Any

from kubesim import apierrors
from kubesim.apierrors import FieldError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand


def random_suffix(length: int = 5) -> str:
    """A random suffix for ``generateName``, from the characters kube-apiserver uses."""
    return "".join(random.choice(_SUFFIX_CHARS) for _ in range(length))


def name_errors(kind: str, name: str | None, *, label: bool = False) -> list[FieldError]:
    """What is wrong with an object's name for ``kind`` (a DNS subdomain, or a DNS label with ``label``)."""
    if not name:
        return [FieldError("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")]
    # apimachinery's IsDNS1123Label / IsDNS1123Subdomain, one error per failed rule, worded as there.
    problems: list[str] = []
    limit = 63 if label else 253
    if len(name) > limit:
        problems.append(f"must be no more than {limit} characters")
    if label and not DNS1123_LABEL.match(name):
        if DNS1123_SUBDOMAIN.match(name):
            problems.append("must not contain dots")
        else:
            problems.append(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            )
    elif not label and not DNS1123_SUBDOMAIN.match(name):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
            "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation "
            "is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return [FieldError("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {p}') for p in problems]


TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB


def annotation_errors(obj: dict[str, Any]) -> list[FieldError]:
    """ObjectMeta validation: all annotations together (keys and values) at most 256 KiB.

    Client-side ``kubectl apply`` copies the whole object into an annotation, so it cannot apply an
    object over 256 KiB (``kubectl create`` and ``apply --server-side`` can).
    """
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        return [
            FieldError(
                "metadata.annotations",
                "FieldValueTooLong",
                f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes",
            )
        ]
    return []


# --- create-time defaults -----------------------------------------------------------------------


def prepare_create(kind: str, obj: dict[str, Any]) -> None:
    """The defaults and derived fields a created built-in gets (pod defaults, Secret data, Namespace status, ...)."""
    if kind == "Pod":
        _pod_defaults(obj)
    elif kind == "Secret":
        _secret_string_data(obj)
        obj["type"] = obj.get("type") or "Opaque"
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    elif kind == "CustomResourceDefinition":
        obj["status"] = _crd_status(obj)
    elif kind == "Service":
        _service_defaults(obj, None)


def prepare_update(kind: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """What an update of a built-in does besides storing it (Secret stringData folded in, status kept, ...)."""
    if kind == "Secret":
        _secret_string_data(new)
    elif kind == "Namespace":
        new["status"] = copy.deepcopy(old.get("status", {})) if "status" not in new else new["status"]
    elif kind == "CustomResourceDefinition":
        new["status"] = _crd_status(new)
    elif kind == "Service":
        _service_defaults(new, old)


def _service_defaults(svc: dict[str, Any], old: dict[str, Any] | None) -> None:
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    if spec["type"] == "ExternalName":
        return
    spec.setdefault("internalTrafficPolicy", "Cluster")
    old_spec = (old or {}).get("spec") or {}
    for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
        if not spec.get(field) and old_spec.get(field):  # the REST strategy keeps allocated values
            spec[field] = copy.deepcopy(old_spec[field])
    if not spec.get("clusterIP"):
        spec["clusterIP"] = f"10.{96 + random.randrange(16)}.{random.randrange(256)}.{random.randrange(2, 255)}"
    spec.setdefault("clusterIPs", [spec["clusterIP"]])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")


def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    """What the apiextensions controllers report once a CRD is served: names accepted, established."""
    spec = crd.get("spec") or {}
    storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
    return {
        "acceptedNames": spec.get("names", {}),
        "storedVersions": storage,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
    }


def _secret_string_data(obj: dict[str, Any]) -> None:
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _pod_defaults(pod: dict[str, Any]) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec.setdefault(
        "tolerations",
        [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    )
    for container in spec.get("containers") or []:
        image = str(container.get("image", ""))
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
    _service_account_token(pod)
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def _service_account_token(pod: dict[str, Any]) -> None:
    """The ServiceAccount admission plugin: mount an API token unless automount is off."""
    spec = pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return
    volume = f"kube-api-access-{''.join(random.choice(string.ascii_lowercase + string.digits) for _ in range(5))}"
    spec.setdefault("volumes", []).append(
        {
            "name": volume,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        }
    )
    for container in spec.get("containers") or []:
        container.setdefault("volumeMounts", []).append(
            {"name": volume, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        )


def _qos_class(spec: dict[str, Any]) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(res) is not None
        and (r.get("requests") or {}).get(res, (r.get("limits") or {}).get(res)) == (r.get("limits") or {}).get(res)
        for r in resources
        for res in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


# --- validation ---------------------------------------------------------------------------------


def pod_errors(pod: dict[str, Any]) -> list[FieldError]:
    """The pod validations a misbehaving operator is most likely to hit."""
    errors: list[FieldError] = []
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("spec.containers", "FieldValueRequired", "Required value"))
    seen: set[str] = set()
    for i, container in enumerate(containers):
        name = container.get("name")
        if not name:
            errors.append(FieldError(f"spec.containers[{i}].name", "FieldValueRequired", "Required value"))
        elif not DNS1123_LABEL.match(name):
            errors.append(
                FieldError(
                    f"spec.containers[{i}].name",
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower '
                    "case alphanumeric characters or '-'",
                )
            )
        elif name in seen:
            errors.append(FieldError(f"spec.containers[{i}].name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        seen.add(name or "")
        if not container.get("image"):
            errors.append(FieldError(f"spec.containers[{i}].image", "FieldValueRequired", "Required value"))
        for j, port in enumerate(container.get("ports") or []):
            number = port.get("containerPort")
            where = f"spec.containers[{i}].ports[{j}].containerPort"
            if not number:  # as kube-apiserver: 0 (or absent) is a missing value
                errors.append(FieldError(where, "FieldValueRequired", "Required value"))
            elif not isinstance(number, int) or not 1 <= number <= 65535:
                errors.append(
                    FieldError(
                        where, "FieldValueInvalid", f"Invalid value: {number}: must be between 1 and 65535, inclusive"
                    )
                )
        for j, env in enumerate(container.get("env") or []):
            if not re.match(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", env.get("name") or ""):
                errors.append(
                    FieldError(
                        f"spec.containers[{i}].env[{j}].name",
                        "FieldValueInvalid",
                        f"Invalid value: {env.get('name')!r}: a valid environment variable name "
                        "must consist of alphabetic characters, digits, '_', '-', or '.'",
                    )
                )
            source = env.get("valueFrom") or {}
            if env.get("value") and source:
                errors.append(
                    FieldError(
                        f"spec.containers[{i}].env[{j}].valueFrom",
                        "FieldValueInvalid",
                        'Invalid value: "": may not be specified when `value` is not empty',
                    )
                )
            if len(source) > 1:
                errors.append(
                    FieldError(
                        f"spec.containers[{i}].env[{j}].valueFrom",
                        "FieldValueInvalid",
                        'Invalid value: "": may not have more than one field specified at a time',
                    )
                )
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        errors.append(
            FieldError(
                "spec.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("restartPolicy")}": supported values: "Always", "OnFailure", "Never"',
            )
        )
    return errors


_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def pod_update_errors(old: dict[str, Any], new: dict[str, Any]) -> list[FieldError]:
    """A pod's spec is immutable apart from a few fields (images, deadline, added tolerations)."""

    def comparable(spec: dict[str, Any]) -> dict[str, Any]:
        spec = {k: v for k, v in copy.deepcopy(spec).items() if k not in _MUTABLE_POD_SPEC}
        for container in spec.get("containers") or []:
            container.pop("image", None)
        return spec

    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("nodeName") and not new_spec.get("nodeName"):
        new_spec["nodeName"] = old_spec["nodeName"]
    if comparable(old_spec) != comparable(new_spec):
        return [
            FieldError(
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                "(allow it to be set to 1 if it was previously negative)",
            )
        ]
    return []


# --- Pod Security admission (policy version "latest") -------------------------------------------


_BASELINE_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def pod_security_violations(pod: dict[str, Any], level: str) -> list[str]:  # noqa: C901 -- upstream's checks, in order
    """The violations kube-apiserver lists for PodSecurity ``level`` (baseline or restricted)."""
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    found: list[str] = []

    def names(pred: Any) -> list[str]:
        return [f'"{c.get("name")}"' for c in containers if pred(c, c.get("securityContext") or {})]

    def plural(items: list[str]) -> str:
        return ("container " if len(items) == 1 else "containers ") + ", ".join(items)

    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            found.append(f"host namespaces ({host}=true)")
    if bad := names(lambda c, sc: sc.get("privileged")):
        found.append(f"privileged ({plural(bad)} must not set securityContext.privileged=true)")
    if bad := names(lambda c, sc: any(p.get("hostPort") for p in c.get("ports") or [])):
        found.append(f"hostPort ({plural(bad)} uses hostPort)")
    volumes = [v.get("name") for v in spec.get("volumes") or [] if not (set(v) - {"name"}) <= _BASELINE_VOLUMES]
    if level == "restricted" and volumes:
        found.append(f"restricted volume types (volumes {', '.join(map(repr, volumes))})")
    elif any("hostPath" in v for v in spec.get("volumes") or []):
        found.append("hostPath volumes")
    if level != "restricted":
        return found

    if bad := names(lambda c, sc: sc.get("allowPrivilegeEscalation") is not False):
        found.append(
            f"allowPrivilegeEscalation != false ({plural(bad)} must set securityContext.allowPrivilegeEscalation=false)"
        )
    if bad := names(lambda c, sc: "ALL" not in ((sc.get("capabilities") or {}).get("drop") or [])):
        found.append(f'unrestricted capabilities ({plural(bad)} must set securityContext.capabilities.drop=["ALL"])')
    if bad := names(lambda c, sc: set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}):
        found.append(f"unrestricted capabilities ({plural(bad)} must not include added capabilities)")
    if bad := names(lambda c, sc: sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True):
        found.append(f"runAsNonRoot != true (pod or {plural(bad)} must set securityContext.runAsNonRoot=true)")
    if pod_sc.get("runAsUser") == 0 or names(lambda c, sc: sc.get("runAsUser") == 0):
        found.append("runAsUser=0 (pod and containers must not set runAsUser=0)")

    def seccomp_ok(sc: dict[str, Any]) -> bool:
        profile = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        return profile in ("RuntimeDefault", "Localhost")

    if bad := names(lambda c, sc: not seccomp_ok(sc)):
        found.append(
            f"seccompProfile (pod or {plural(bad)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return found


def pod_security(pod: dict[str, Any], namespace: dict[str, Any] | None) -> tuple[str | None, list[str]]:
    """(enforce error message or None, warnings) for the namespace's pod-security labels."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    error, warnings = None, []
    for mode in ("enforce", "warn"):
        level = labels.get(f"pod-security.kubernetes.io/{mode}")
        if level not in ("baseline", "restricted"):
            continue
        violations = pod_security_violations(pod, level)
        if not violations:
            continue
        text = f'violates PodSecurity "{level}:latest": ' + ", ".join(violations)
        if mode == "enforce":
            error = text
        else:
            warnings.append(f'would violate PodSecurity "{level}:latest": ' + ", ".join(violations))
    return error, warnings


def forbidden_pod(name: str, message: str) -> apierrors.ApiError:
    """The 403 a pod refused by Pod Security gets."""
    return apierrors.forbidden("pods", name, message)
