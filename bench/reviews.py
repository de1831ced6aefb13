"""Realistic AdmissionReviews for the benchmarks, generated deterministically.

``python -m bench.reviews`` (re)writes bench/reviews/*.json; ``bench.run`` and the ``decide()``
micro-benchmark read the same reviews. Pods look like what kube-apiserver sends on CREATE: the
envelope carries ``userInfo``, ``options`` and ``requestKind``, pods created by controllers carry
``ownerReferences`` and ``managedFields``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REVIEWS_DIR = Path(__file__).parent / "reviews"
# Every request gets a fresh uid in the load generator (the apiserver never repeats one); the
# placeholder has the length of a real uid so that bodies keep their size.
UID_PLACEHOLDER = "00000000-0000-4000-8000-000000000000"

INFERENCE_NAMESPACE = "inference-serving"
TRAINING_NAMESPACE = "ml-training"
WEB_NAMESPACE = "web"

# scenario -> (title, expected "allowed")
SCENARIOS: dict[str, tuple[str, bool]] = {
    "inference-small": ("small inference pod (1 GPU container)", True),
    "training-small": ("small training pod (1 GPU container)", True),
    "training-denied": ("training pod targeting reserved nodes (denied)", False),
    "large": ("large pod: 30 containers x 40 env vars, 8-term affinity", True),
    "non-gpu": ("non-GPU pod (1 CPU container)", True),
}


def _metadata(name: str, namespace: str, labels: dict[str, str], *, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "generateName": f"{name}-",
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": {"kubectl.kubernetes.io/default-container": name},
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{name}-7d9c5b8f6",
                "uid": "2b7e6a7c-1f51-4b0e-9f3e-5a0c1d2e3f40",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        meta["managedFields"] = [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-08-01T12:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {"f:app": {}}}, "f:spec": {}},
            }
        ]
    return meta


def _container(
    name: str, *, gpus: int = 0, env_vars: int = 4, image: str = "rocm/vllm:rocm6.4_vllm0.9"
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": "4", "memory": "32Gi"}
    limits: dict[str, str] = {"memory": "32Gi"}
    if gpus:
        requests["amd.com/gpu"] = limits["amd.com/gpu"] = str(gpus)
    return {
        "name": name,
        "image": image,
        "command": ["python3", "-m", "server"],
        "args": ["--port", "8000", "--tensor-parallel-size", str(max(gpus, 1))],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "env": [{"name": f"APP_SETTING_{i:02d}", "value": f"value-{i:02d}"} for i in range(env_vars)],
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [
            {"name": "model-cache", "mountPath": "/models"},
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
        ],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def _pod_spec(containers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "volumes": [
            {"name": "model-cache", "emptyDir": {"sizeLimit": "100Gi"}},
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            },
        ],
        "tolerations": [
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
    }
    spec.update(extra)
    return spec


def _affinity(terms: int) -> dict[str, Any]:
    """A required node affinity of ``terms`` ORed terms (MI300X or MI250X in several zones)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "amd.com/gpu.device-id", "operator": "In", "values": ["74a1", "740c"]},
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [f"zone-{i}"]},
                        ]
                    }
                    for i in range(terms)
                ]
            }
        }
    }


def _review(namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID_PLACEHOLDER,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "8d3f5c0e-55a3-4f42-9b9f-6a1f0c2d7e11",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": {"apiVersion": "v1", "kind": "Pod", **pod},
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def inference_small() -> dict[str, Any]:
    meta = _metadata("llama-serve", INFERENCE_NAMESPACE, {"app": "llama-serve", "tier": "online"}, owner="ReplicaSet")
    return _review(INFERENCE_NAMESPACE, {"metadata": meta, "spec": _pod_spec([_container("llama-serve", gpus=1)])})


def training_small() -> dict[str, Any]:
    meta = _metadata("llama-finetune", TRAINING_NAMESPACE, {"app": "llama-finetune"}, owner="ReplicaSet")
    container = _container("trainer", gpus=8, image="rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.6.0")
    return _review(TRAINING_NAMESPACE, {"metadata": meta, "spec": _pod_spec([container], restartPolicy="Never")})


def training_denied() -> dict[str, Any]:
    review = training_small()
    spec = review["request"]["object"]["spec"]
    spec["nodeSelector"] = {"rocm-isolation.io/pool": "inference"}
    spec["tolerations"].append({"key": "rocm-isolation.io/reserved", "operator": "Exists"})
    return review


def sized_pod(containers: int, *, env_vars: int = 40, terms: int = 8) -> dict[str, Any]:
    """A training pod with ``containers`` GPU containers of ``env_vars`` variables each and a ``terms``-term affinity."""
    meta = _metadata(
        "sharded-train", TRAINING_NAMESPACE, {"app": "sharded-train", "shard-set": "a"}, owner="ReplicaSet"
    )
    body = [_container(f"shard-{i:03d}", gpus=1, env_vars=env_vars) for i in range(containers)]
    return _review(TRAINING_NAMESPACE, {"metadata": meta, "spec": _pod_spec(body, affinity=_affinity(terms))})


def large() -> dict[str, Any]:
    return sized_pod(30)


def non_gpu() -> dict[str, Any]:
    meta = _metadata("frontend", WEB_NAMESPACE, {"app": "frontend"}, owner="ReplicaSet")
    container = _container("frontend", image="nginx:1.27")
    return _review(WEB_NAMESPACE, {"metadata": meta, "spec": _pod_spec([container])})


BUILDERS = {
    "inference-small": inference_small,
    "training-small": training_small,
    "training-denied": training_denied,
    "large": large,
    "non-gpu": non_gpu,
}


def encode(review: dict[str, Any]) -> bytes:
    """The body as the apiserver sends it: compact JSON."""
    return json.dumps(review, separators=(",", ":")).encode()


def path(name: str) -> Path:
    return REVIEWS_DIR / f"{name}.json"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path(name).read_text())
    return data


def write_all() -> list[Path]:
    REVIEWS_DIR.mkdir(exist_ok=True)
    written = []
    for name, build in BUILDERS.items():
        target = path(name)
        target.write_text(json.dumps(build(), indent=1) + "\n")
        written.append(target)
    return written


if __name__ == "__main__":
    for written in write_all():
        print(written, file=sys.stderr)
