"""A small raw-JSON client for the end-to-end suite (its own, independent of webhook/cluster/kubeapi.py, which
is under test): one keep-alive HTTPS connection per thread, client-certificate auth, impersonation
headers, server-side apply, dry-run, subresources."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
FIELD_MANAGER = "rocm-isolation-e2e"

# kind -> (api prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "Event": ("/api/v1", "events", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ControllerRevision": ("/apis/apps/v1", "controllerrevisions", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "MutatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "mutatingadmissionpolicies", False),
    "MutatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicybindings",
        False,
    ),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "DeviceTaintRule": ("/apis/resource.k8s.io/v1beta2", "devicetaintrules", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "PolicyReport": ("/apis/wgpolicyk8s.io/v1alpha2", "policyreports", True),
    "ClusterPolicyReport": ("/apis/wgpolicyk8s.io/v1alpha2", "clusterpolicyreports", False),
}


class ApiError(Exception):
    def __init__(self, status: int, body: Obj, method: str, path: str) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", ""))
        self.message = str(body.get("message", body))
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")


def path_for(
    kind: str,
    name: str | None = None,
    namespace: str | None = None,
    subresource: str | None = None,
    *,
    api_version: str | None = None,
) -> str:
    """The REST path of ``kind``; ``api_version`` (group/version) overrides the version KINDS serves it in."""
    prefix, plural, namespaced = KINDS[kind]
    if api_version is not None:
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [prefix]
    if namespaced and namespace:
        parts += ["namespaces", urllib.parse.quote(namespace)]
    parts.append(plural)
    if name:
        parts.append(urllib.parse.quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _object_path(obj: Obj, *, collection: bool = False, namespace: str | None = None) -> str:
    """The path of ``obj`` (or of its collection), in the version its ``apiVersion`` names."""
    meta = obj.get("metadata", {})
    name = None if collection else meta["name"]
    return path_for(obj["kind"], name, namespace or meta.get("namespace"), api_version=obj.get("apiVersion"))


class Kube:
    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        impersonate: str | None = None,
        groups: Iterable[str] = (),
    ) -> None:
        self.host, self.port, self.context = host, port, context
        self.impersonate, self.groups = impersonate, tuple(groups)
        self._local = threading.local()

    def as_user(self, user: str, groups: Iterable[str] = ()) -> Kube:
        return Kube(self.host, self.port, self.context, impersonate=user, groups=groups)

    def _connection(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        raw: bool = False,
    ) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        headers = {"Accept": "application/json"}
        data: bytes | None = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if self.impersonate:
            headers["Impersonate-User"] = self.impersonate
        for attempt in range(3):
            conn = self._connection()
            try:
                # http.client takes one value per header: impersonated groups go as separate headers.
                conn.putrequest(method, path + query, skip_accept_encoding=True)
                for key, value in headers.items():
                    conn.putheader(key, value)
                for group in self.groups:
                    conn.putheader("Impersonate-Group", group)
                conn.putheader("Content-Length", str(len(data or b"")))
                conn.endheaders(data)
                response = conn.getresponse()
                payload = response.read()
                # Admission warnings reach the client as `Warning: 299 - "text"` headers.
                self._local.warnings = [_warning_text(v) for k, v in response.getheaders() if k.lower() == "warning"]
                break
            # A kept-alive connection the apiserver closed meanwhile: over TLS the next request sees
            # SSLEOFError (an SSLError, not a ConnectionError). Reconnect and send it again.
            except (ConnectionError, http.client.HTTPException, TimeoutError, ssl.SSLError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2)
        if raw:
            if response.status >= 400:
                raise ApiError(response.status, {"message": payload.decode(errors="replace")}, method, path)
            return payload.decode()
        decoded: Any = json.loads(payload) if payload else {}
        if response.status >= 400:
            raise ApiError(response.status, decoded if isinstance(decoded, dict) else {}, method, path)
        return decoded

    @property
    def last_warnings(self) -> list[str]:
        """The warnings of this thread's last response."""
        warnings: list[str] = getattr(self._local, "warnings", [])
        return warnings

    # --- verbs -------------------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None, *, subresource: str | None = None) -> Obj:
        result: Obj = self.request("GET", path_for(kind, name, namespace, subresource))
        return result

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(kind, name, namespace)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def crd_established(self, name: str) -> bool:
        """True once the CRD serves its kind. Right after a create the apiserver may answer
        with ``status.conditions: null`` (seen in CI), so a missing or null list is "not yet"."""
        crd = self.get_or_none("CustomResourceDefinition", name) or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    def list(
        self, kind: str, namespace: str | None = None, *, selector: str | None = None, fields: str | None = None
    ) -> list[Obj]:
        params = {}
        if selector:
            params["labelSelector"] = selector
        if fields:
            params["fieldSelector"] = fields
        result = self.request("GET", path_for(kind, namespace=namespace), params=params)
        items: list[Obj] = result.get("items", [])
        return items

    def create(self, obj: Obj, *, dry_run: bool = False, namespace: str | None = None) -> Obj:
        params = {"dryRun": "All"} if dry_run else None
        result: Obj = self.request("POST", _object_path(obj, collection=True, namespace=namespace), obj, params=params)
        return result

    def replace(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        params = {"dryRun": "All"} if dry_run else None
        result: Obj = self.request("PUT", _object_path(obj), obj, params=params)
        return result

    def apply(self, obj: Obj, *, force: bool = True) -> Obj:
        """Server-side apply (what ``kubectl apply --server-side`` sends)."""
        params = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
        result: Obj = self.request(
            "PATCH", _object_path(obj), obj, params=params, content_type="application/apply-patch+yaml"
        )
        return result

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        dry_run: bool = False,
    ) -> Obj:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[patch_type]
        params = {"dryRun": "All"} if dry_run else None
        result: Obj = self.request(
            "PATCH", path_for(kind, name, namespace, subresource), patch, params=params, content_type=content_type
        )
        return result

    def delete(self, kind: str, name: str, namespace: str | None = None, *, force: bool = False) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if force:
            body["gracePeriodSeconds"] = 0  # type: ignore[assignment]
        try:
            self.request("DELETE", path_for(kind, name, namespace), body)
        except ApiError as err:
            if err.status != 404:
                raise

    def metrics(self) -> str:
        text: str = self.request("GET", "/metrics", raw=True)
        return text


def _warning_text(header: str) -> str:
    _code, _, rest = header.partition(" ")
    _agent, _, text = rest.partition(" ")
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text


def wait_until(condition: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll until ``condition()`` is truthy and return it; generous timeouts (a busy 2-core CI)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition} (last: {last!r})")
