"""A stateful fake Kubernetes API: a real local HTTP server holding objects.

kube-apiserver cannot run here. This server answers the requests the project makes the way the
apiserver does, over real HTTP, so the ``kubernetes`` client and ``webhook.cluster.kubeapi`` talk to it
unchanged:

- lists (``GET`` a collection, cluster-wide or in a namespace) are paginated exactly like the
  apiserver's: ``limit`` items per page, ``metadata.continue`` (an opaque token; as in the
  apiserver it encodes the list's resourceVersion and the key to start from), the same
  ``metadata.resourceVersion`` on every page (a consistent snapshot: objects written after the
  first page do not show up in later pages), ``metadata.remainingItemCount`` only when the list has
  no label or field selector;
- label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!key``) and field selectors
  (``=``, ``==``, ``!=`` on the fields the apiserver supports for that resource; others answer
  400 ``field label not supported``);
- a continue token older than the compaction (``expire_continue_tokens``) answers 410 with reason
  ``Expired`` and the apiserver's message, offering an inconsistent continue token;
- ``404 NotFound`` and ``403 Forbidden`` as ``Status`` objects with the apiserver's messages; a
  resource whose API version is not served answers 404 "the server could not find the requested
  resource";
- watches (``watch=true``) are held open without events until their ``timeoutSeconds``: enough for
  the webhook's watch cache to sync against it (tests that need events use fake_kube_api.py);
- ``POST`` (create; 409 ``AlreadyExists``) and ``PUT`` (update; 409 ``Conflict`` when
  ``metadata.resourceVersion`` is not the stored one), each bumping the global resourceVersion, and
  ``DELETE`` (``DeleteOptions.preconditions`` uid/resourceVersion: 409 ``Conflict`` when they differ); with
  ``dryRun=All`` they answer the same and persist nothing; ``clock`` (when set) gives created objects their
  ``creationTimestamp``, as the apiserver sets it (one-second resolution);
- API discovery (``GET /apis/GROUP/VERSION``, an ``APIResourceList``) once ``serve_discovery`` is called,
  with extra resource names (``devicetaintrules``) a test wants served; 404 before, as until now;
- ``PATCH`` with ``application/merge-patch+json`` (RFC 7386; the other patch types answer 415
  with the apiserver's message): a ``metadata.resourceVersion`` in the patch is a precondition
  (409 ``Conflict``), the result is validated (the Kubernetes 1.37 schema, strict, and duplicate
  node taints, 422 ``Invalid``), ``dryRun=All`` validates without persisting (any other value: 400);
- ``POST pods/NAME/eviction`` (policy/v1 ``Eviction``), as ``pkg/registry/core/pod/storage/
  eviction.go`` does it: a pod that is not running (Pending, Succeeded, Failed) is deleted without
  looking at budgets; otherwise the PodDisruptionBudgets of its namespace whose selector matches it
  decide: more than one answers 500, one with ``status.disruptionsAllowed`` 0 answers 429 with the
  apiserver's Status ("Cannot evict pod as it would violate the pod's disruption budget.", cause
  ``DisruptionBudget``), else the budget is decremented and the pod deleted (201, a ``Status``
  Success). ``allow_evictions_after`` scripts a budget that refuses N times and then allows (its
  controller saw a replacement become ready), ``edit_before_next_patch`` a concurrent edit.

Every request is recorded (method, path, query, body). Faults for tests: ``forbid``, ``throttle``
(429 with ``Retry-After``), ``drop_after`` (connections cut, as when the apiserver goes away).

To add a verb: write it next to ``_replace`` and route it in ``_dispatch``; ``_stored``/``_store``
read and write objects.

Objects are kept serialized (``orjson``) with the few fields selectors need, so that the scale
benchmark's 150,000 pods fit in memory; ``add`` takes objects exactly as the apiserver returns them.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

CLUSTER_FIXTURES = Path(__file__).parent / "fixtures" / "cluster"

EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)


# What API discovery lists of admissionregistration.k8s.io/v1 beyond RESOURCES on 1.36 (issue 47), and on 1.34 and
# 1.35 as they ship (no MutatingAdmissionPolicy: ValidatingAdmissionPolicy only, GA since 1.30).
MUTATING_ADMISSION_POLICIES = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
VALIDATING_ADMISSION_POLICIES = ("validatingadmissionpolicies", "validatingadmissionpolicybindings")


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool
    # Field selectors the apiserver supports for this resource (besides metadata.name/namespace).
    fields: tuple[str, ...] = ()
    # Off by default in a real cluster (a feature gate): API discovery lists it only when a test says it is
    # served (``serve_discovery``); its requests are answered either way.
    gated: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = (
    Resource("", ("v1",), "namespaces", "Namespace", False, ("status.phase",)),
    Resource("", ("v1",), "nodes", "Node", False, ("spec.unschedulable",)),
    Resource(
        "",
        ("v1",),
        "pods",
        "Pod",
        True,
        ("spec.nodeName", "spec.schedulerName", "spec.serviceAccountName", "status.phase", "status.nominatedNodeName"),
    ),
    Resource("resource.k8s.io", ("v1", "v1beta2", "v1beta1"), "resourceclaims", "ResourceClaim", True),
    Resource("resource.k8s.io", ("v1", "v1beta2", "v1beta1"), "resourceclaimtemplates", "ResourceClaimTemplate", True),
    Resource("resource.k8s.io", ("v1", "v1beta2", "v1beta1"), "deviceclasses", "DeviceClass", False),
    Resource("resource.k8s.io", ("v1", "v1beta2", "v1beta1"), "resourceslices", "ResourceSlice", False),
    Resource("resource.k8s.io", ("v1", "v1beta2"), "devicetaintrules", "DeviceTaintRule", False, gated=True),
    # Stored for pool's check of the device backstop; API discovery lists it with serve_discovery's minor (above).
    Resource(
        "admissionregistration.k8s.io",
        ("v1",),
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
        gated=True,
    ),
    Resource("", ("v1",), "configmaps", "ConfigMap", True),
    Resource("coordination.k8s.io", ("v1",), "leases", "Lease", True),
    Resource("policy", ("v1",), "poddisruptionbudgets", "PodDisruptionBudget", True),
)


def fixture(name: str) -> Any:
    return orjson.loads((CLUSTER_FIXTURES / name).read_bytes())


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any = None
    content_type: str = ""
    status: int = 0  # the answer's HTTP status (0: no answer, the connection was cut)


@dataclass
class Stored:
    key: str  # "namespace/name" or "name": the apiserver's (etcd) key order
    body: bytes
    labels: dict[str, str]
    fields: dict[str, str]

    @property
    def object(self) -> dict[str, Any]:
        result: dict[str, Any] = orjson.loads(self.body)
        return result


def _dig(obj: Mapping[str, Any], dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


# -- selectors ------------------------------------------------------------------------------------


class BadRequest(Exception):
    pass


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def label_matcher(selector: str) -> Any:
    """A predicate over a label map, for the apiserver's label selector syntax."""
    checks = []
    for term in _split_terms(selector):
        words = term.split()
        if len(words) >= 2 and words[1] in ("in", "notin"):
            key, op = words[0], words[1]
            rest = term.split(None, 2)[2].strip()
            if not (rest.startswith("(") and rest.endswith(")")):
                raise BadRequest(f"unable to parse requirement: {term}")
            values = {v.strip() for v in rest[1:-1].split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        else:
            checks.append(lambda labels, k=term: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def field_matcher(selector: str, resource: Resource) -> Any:
    supported = ("metadata.name", "metadata.namespace", *resource.fields)
    checks = []
    for term in _split_terms(selector):
        negate = "!=" in term
        key, value = (s.strip() for s in (term.split("!=", 1) if negate else term.replace("==", "=").split("=", 1)))
        if key not in supported:
            raise BadRequest(f'"{key}" is not a known field selector: only "{", ".join(supported)}"')
        if negate:
            checks.append(lambda fields, k=key, v=value: fields.get(k, "") != v)
        else:
            checks.append(lambda fields, k=key, v=value: fields.get(k, "") == v)
    return lambda fields: all(check(fields) for check in checks)


# -- the server -----------------------------------------------------------------------------------


@dataclass
class Route:
    resource: Resource
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass
class _Snapshot:
    rv: int
    items: list[Stored]
    keys: list[str] = field(default_factory=list)


class FakeCluster:
    def __init__(self, *, served_versions: Mapping[str, Iterable[str]] | None = None) -> None:
        """``served_versions``: group -> the versions served (default: every version of ``RESOURCES``)."""
        self.resources = {(r.group, r.plural): r for r in RESOURCES}
        self.served = {
            group: tuple(versions) for group, versions in (served_versions or {}).items()
        }  # groups not named: all versions
        self.store: dict[tuple[str, str], dict[str, Stored]] = {key: {} for key in self.resources}
        self.rv = 1000
        self.compacted_rv = 0
        self.requests: list[Request] = []
        self.lock = threading.RLock()
        self._snapshots: dict[tuple[Any, ...], _Snapshot] = {}
        self._forbidden: set[tuple[str, str]] = set()  # (plural, verb)
        self._throttle = 0
        self._throttle_retry_after = 1
        self._drop_after: int | None = None
        self._expire_after: int | None = None
        self._served_pages = 0
        self._uids = itertools.count(1)
        self._before_patch: dict[str, tuple[Any, int]] = {}  # node name -> (a concurrent edit, how often)
        self._before_update: dict[tuple[str, str], tuple[Any, int]] = {}  # (plural, name) -> (edit, how often)
        self._budget_refusals: dict[tuple[str, str], int] = {}  # (namespace, pdb) -> refusals left
        self._stopping = threading.Event()
        # The creationTimestamp of objects created through the API (None: the fixtures' default instant).
        self.clock: Any = None
        self._discovery: dict[str, tuple[str, ...]] | None = None  # "group/version" -> extra resource names
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                cluster._serve(self, "GET")

            def do_POST(self) -> None:
                cluster._serve(self, "POST")

            def do_PUT(self) -> None:
                cluster._serve(self, "PUT")

            def do_PATCH(self) -> None:
                cluster._serve(self, "PATCH")

            def do_DELETE(self) -> None:
                cluster._serve(self, "DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- lifecycle, configuration ---------------------------------------------------------------

    def start(self) -> FakeCluster:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_bytes(
            orjson.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": "Bearer fake-token"}
        return client.ApiClient(configuration)

    def serve_discovery(self, extra: Mapping[str, Iterable[str]] | None = None, *, minor: str = "1.36") -> None:
        """Answer API discovery (``GET /apis/GROUP/VERSION``) for the versions served, listing the resources
        of ``RESOURCES`` and ``extra`` ("resource.k8s.io/v1beta2" -> ["devicetaintrules"]); a 1.36 cluster: the
        MutatingAdmissionPolicy is served (``deploy/minors.from_cluster`` reads the minor from it); ``minor`` 1.34
        or 1.35: a stock one, which serves none (resource.k8s.io as on 1.36)."""
        if minor not in ("1.34", "1.35", "1.36"):
            raise ValueError(f"the fake's discovery is a 1.34, 1.35 or 1.36 one, not {minor}")
        placement = MUTATING_ADMISSION_POLICIES if minor == "1.36" else VALIDATING_ADMISSION_POLICIES
        self._discovery = {"admissionregistration.k8s.io/v1": placement}
        self._discovery.update({gv: tuple(names) for gv, names in (extra or {}).items()})

    def forbid(self, plural: str, verb: str = "list") -> None:
        """Answer 403 to ``verb`` (get, list, create, update) on ``plural``, as RBAC does."""
        self._forbidden.add((plural, verb))

    def throttle(self, count: int, retry_after: int = 1) -> None:
        """The next ``count`` requests answer 429 with ``Retry-After`` (API Priority and Fairness)."""
        self._throttle, self._throttle_retry_after = count, retry_after

    def drop_after(self, pages: int) -> None:
        """After ``pages`` more list pages, every connection is cut without an answer (apiserver gone)."""
        self._drop_after = self._served_pages + pages

    def expire_after(self, pages: int) -> None:
        """Compact once ``pages`` more list pages have been served (a list slower than the
        compaction window: its next continue token answers 410 Expired)."""
        self._expire_after = self._served_pages + pages

    def expire_continue_tokens(self) -> None:
        """Compact: every continue token issued so far answers 410 Expired."""
        with self.lock:
            self.rv += 1
            self.compacted_rv = self.rv
            self._snapshots.clear()

    def edit_before_next_patch(self, name: str, edit: Any, *, times: int = 1) -> None:
        """The next ``times`` PATCHes of node ``name`` first see someone else's edit (``edit(obj)``,
        stored with a new resourceVersion), as when another client writes between our read and our
        patch."""
        self._before_patch[name] = (edit, times)

    def edit_before_next_update(self, plural: str, name: str, edit: Any, *, times: int = 1) -> None:
        """The next ``times`` PUTs of the cluster-scoped object ``plural``/``name`` first see someone else's
        edit (``edit(obj)``, stored with a new resourceVersion), as ``edit_before_next_patch`` for nodes."""
        self._before_update[(plural, name)] = (edit, times)

    def allow_evictions_after(self, namespace: str, pdb: str, *, refusals: int) -> None:
        """The budget ``pdb`` (stored with ``disruptionsAllowed: 0``) refuses ``refusals`` evictions,
        then its controller raises ``disruptionsAllowed`` to 1 (a replacement pod became ready)."""
        self._budget_refusals[(namespace, pdb)] = refusals

    def requests_to(self, path: str, method: str = "GET") -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path and r.method == method]

    # -- objects --------------------------------------------------------------------------------

    def resource_of(self, obj: Mapping[str, Any]) -> Resource:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        for resource in RESOURCES:
            if resource.group == group and resource.kind == obj.get("kind"):
                return resource
        raise ValueError(f"no resource for {obj.get('apiVersion')} {obj.get('kind')}")

    def add(self, *objects: Mapping[str, Any]) -> None:
        """Store objects as given (as the apiserver returns them); a missing resourceVersion is set."""
        with self.lock:
            for obj in objects:
                self._store(self.resource_of(obj), dict(obj), keep_version=True)

    def add_encoded(
        self, resource: Resource, key: str, body: bytes, labels: dict[str, str], fields: dict[str, str]
    ) -> None:
        """Store an already serialized object (the scale benchmark builds 150,000 of them)."""
        self.store[(resource.group, resource.plural)][key] = Stored(key, body, labels, fields)

    def get_object(
        self, plural: str, name: str, namespace: str | None = None, group: str = ""
    ) -> dict[str, Any] | None:
        stored = self.store[(group, plural)].get(f"{namespace}/{name}" if namespace else name)
        return stored.object if stored else None

    def delete_object(self, plural: str, name: str, namespace: str | None = None, group: str = "") -> None:
        with self.lock:
            self.store[(group, plural)].pop(f"{namespace}/{name}" if namespace else name, None)
            self.rv += 1

    def _store(self, resource: Resource, obj: dict[str, Any], *, keep_version: bool = False) -> Stored:
        metadata = obj.setdefault("metadata", {})
        self.rv += 1
        if not (keep_version and metadata.get("resourceVersion")):
            metadata["resourceVersion"] = str(self.rv)
        metadata.setdefault("uid", str(uuid.UUID(int=next(self._uids))))
        metadata.setdefault("creationTimestamp", "2026-12-01T08:00:00Z")
        name, namespace = str(metadata.get("name", "")), metadata.get("namespace")
        key = f"{namespace}/{name}" if resource.namespaced else name
        fields = {"metadata.name": name, "metadata.namespace": str(namespace or "")}
        for dotted in resource.fields:
            fields[dotted] = _dig(obj, dotted)
        # Kept without kind/apiVersion: list items of built-in resources carry none (the list does);
        # a GET adds them back.
        body = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        stored = Stored(key, orjson.dumps(body), dict(metadata.get("labels") or {}), fields)
        self.store[(resource.group, resource.plural)][key] = stored
        return stored

    # -- HTTP -----------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = orjson.loads(raw) if raw else None
        request = Request(method, unquote(url.path), query, body, str(handler.headers.get("Content-Type") or ""))
        with self.lock:
            self.requests.append(request)
            drop = self._drop_after is not None and self._served_pages >= self._drop_after
            throttled = self._throttle > 0
            if throttled:
                self._throttle -= 1
        if drop:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if throttled:
            self._status(
                handler,
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                {"retryAfterSeconds": self._throttle_retry_after},
                headers={"Retry-After": str(self._throttle_retry_after)},
            )
            return
        if method == "GET" and query.get("watch") in ("true", "1"):
            self._hold_watch(handler, float(query.get("timeoutSeconds") or 30))
            return
        try:
            code, payload = self._dispatch(method, url.path, query, body, request.content_type)
        except BadRequest as err:
            code, payload = 400, self._status_body(400, "BadRequest", str(err))
        request.status = code
        self._send(handler, code, payload)

    def _hold_watch(self, handler: BaseHTTPRequestHandler, timeout: float) -> None:
        """A watch that sees no change: the stream stays open (no event) until its timeoutSeconds,
        then ends cleanly as the apiserver's does; objects changed through ``add`` are not sent."""
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            handler.wfile.flush()
            self._stopping.wait(min(timeout, 30.0))
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            pass

    def _route(self, path: str) -> Route | None:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource = self.resources.get((group, rest[0]))
        if resource is None or version not in self.served.get(group, resource.versions):
            return None
        if namespace is not None and not resource.namespaced:
            return None
        name = rest[1] if len(rest) >= 2 else None
        subresource = rest[2] if len(rest) >= 3 else None
        return Route(resource, version, namespace, name, subresource)

    def _dispatch(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str = ""
    ) -> tuple[int, Any]:
        discovered = self._discover(method, path)
        if discovered is not None:
            return 200, discovered
        route = self._route(path)
        if route is None:
            return 404, self._status_body(404, "NotFound", "the server could not find the requested resource")
        if route.resource.plural == "pods" and route.subresource == "eviction" and method == "POST":
            if ("pods/eviction", "create") in self._forbidden:
                return 403, self._forbidden_body(route, "create")
            return self._evict(route, query, body)
        verb = {
            ("GET", False): "list",
            ("GET", True): "get",
            ("POST", False): "create",
            ("PUT", True): "update",
            ("PATCH", True): "patch",
            ("DELETE", True): "delete",
        }.get((method, route.name is not None))
        if verb is None or route.subresource is not None:
            return 405, self._status_body(405, "MethodNotAllowed", f"the server does not allow this method on {path}")
        if (route.resource.plural, verb) in self._forbidden:
            return 403, self._forbidden_body(route, verb)
        if verb == "list":
            return self._list(route, query)
        if verb == "get":
            return self._get(route)
        if verb == "create":
            return self._create(route, body, query)
        if verb == "update":
            return self._replace(route, body, query)
        if verb == "patch":
            return self._patch(route, query, body, content_type)
        if verb == "delete":
            return self._delete(route, query, body)
        return 405, self._status_body(405, "MethodNotAllowed", f"{verb} is not implemented by the fake API")

    def _discover(self, method: str, path: str) -> dict[str, Any] | None:
        """An APIResourceList for ``/apis/GROUP/VERSION`` (``serve_discovery``), else None."""
        parts = path.strip("/").split("/")
        if self._discovery is None or method != "GET" or len(parts) != 3 or parts[0] != "apis":
            return None
        group, version = parts[1], parts[2]
        served = [
            r for r in RESOURCES if r.group == group and version in self.served.get(group, r.versions) and not r.gated
        ]
        extra = self._discovery.get(f"{group}/{version}", ())
        if not served and not extra:
            return None
        resources = [
            {"name": r.plural, "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": []}
            for r in served
        ]
        resources += [
            {"name": name, "singularName": "", "namespaced": False, "kind": "", "verbs": []} for name in extra
        ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": resources,
        }

    def _delete(self, route: Route, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        dry_run = self._dry_run(query)
        key = f"{route.namespace}/{route.name}" if route.resource.namespaced else str(route.name)
        preconditions = (body or {}).get("preconditions") or {} if isinstance(body, dict) else {}
        with self.lock:
            current = self.store[(route.resource.group, route.resource.plural)].get(key)
            if current is None:
                return 404, self._not_found(route)
            metadata = current.object["metadata"]
            for field_name in ("uid", "resourceVersion"):
                wanted = preconditions.get(field_name)
                if wanted and str(wanted) != str(metadata.get(field_name)):
                    return 409, self._status_body(
                        409,
                        "Conflict",
                        f"Precondition failed: {field_name}: {wanted}, object's {field_name}: "
                        f"{metadata.get(field_name)}",
                        self._details(route, str(route.name)),
                    )
            if not dry_run:
                del self.store[(route.resource.group, route.resource.plural)][key]
                self.rv += 1
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}

    def _get(self, route: Route) -> tuple[int, Any]:
        key = f"{route.namespace}/{route.name}" if route.resource.namespaced else str(route.name)
        with self.lock:
            stored = self.store[(route.resource.group, route.resource.plural)].get(key)
        if stored is None:
            return 404, self._not_found(route)
        return 200, self._type_meta(route) + stored.body[1:]

    @staticmethod
    def _type_meta(route: Route) -> bytes:
        resource = route.resource
        api_version = f"{resource.group}/{route.version}" if resource.group else route.version
        return orjson.dumps({"kind": resource.kind, "apiVersion": api_version})[:-1] + b","

    def _list(self, route: Route, query: dict[str, str]) -> tuple[int, Any]:
        resource = route.resource
        label_selector, field_selector = query.get("labelSelector", ""), query.get("fieldSelector", "")
        limit = int(query.get("limit") or 0)
        token = query.get("continue", "")
        signature = (resource.group, resource.plural, route.namespace, label_selector, field_selector)
        with self.lock:
            if token:
                try:
                    decoded = orjson.loads(base64.b64decode(token))
                    rv, start = int(decoded["rv"]), str(decoded["start"])
                except (ValueError, KeyError, TypeError):
                    raise BadRequest(f'continue key is not valid: "{token}"') from None
                if rv < self.compacted_rv:
                    inconsistent = self._token(self.rv, start)
                    return 410, {
                        **self._status_body(410, "Expired", EXPIRED_MESSAGE),
                        "metadata": {"continue": inconsistent},
                    }
                snapshot = self._snapshots.get((*signature, rv))
                if snapshot is None:  # not kept (another client's token): read the current state
                    snapshot = self._snapshot(route, label_selector, field_selector, rv)
            else:
                start = ""
                snapshot = self._snapshot(route, label_selector, field_selector, self.rv)
                if limit:
                    self._snapshots[(*signature, snapshot.rv)] = snapshot
            begin = bisect.bisect_left(snapshot.keys, start)
            end = len(snapshot.items) if not limit else min(len(snapshot.items), begin + limit)
            items = snapshot.items[begin:end]
            metadata: dict[str, Any] = {"resourceVersion": str(snapshot.rv)}
            if end < len(snapshot.items):
                metadata["continue"] = self._token(snapshot.rv, snapshot.keys[end - 1] + "\x00")
                if not label_selector and not field_selector:
                    metadata["remainingItemCount"] = len(snapshot.items) - end
            else:
                self._snapshots.pop((*signature, snapshot.rv), None)
            self._served_pages += 1
            if self._served_pages == self._expire_after:
                self._expire_after = None
                self.expire_continue_tokens()
        api_version = f"{resource.group}/{route.version}" if resource.group else route.version
        head = orjson.dumps({"kind": f"{resource.kind}List", "apiVersion": api_version, "metadata": metadata})
        return 200, head[:-1] + b',"items":[' + b",".join(s.body for s in items) + b"]}"

    def _snapshot(self, route: Route, label_selector: str, field_selector: str, rv: int) -> _Snapshot:
        resource = route.resource
        labels_ok = label_matcher(label_selector) if label_selector else None
        fields_ok = field_matcher(field_selector, resource) if field_selector else None
        prefix = f"{route.namespace}/" if route.namespace is not None else ""
        items = [
            stored
            for stored in self.store[(resource.group, resource.plural)].values()
            if stored.key.startswith(prefix)
            and (labels_ok is None or labels_ok(stored.labels))
            and (fields_ok is None or fields_ok(stored.fields))
        ]
        items.sort(key=lambda s: s.key)
        return _Snapshot(rv, items, [s.key for s in items])

    @staticmethod
    def _token(rv: int, start: str) -> str:
        # The apiserver's format: base64 of {"v":"meta.k8s.io/v1","rv":N,"start":"<key>\u0000"}.
        return base64.b64encode(orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start})).decode()

    def _create(self, route: Route, body: Any, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the request body is not an object")
        dry_run = self._dry_run(query or {})
        body = orjson.loads(orjson.dumps(body))  # the recorded request keeps what was sent
        metadata = body.setdefault("metadata", {})
        if self.clock is not None:
            metadata["creationTimestamp"] = self.clock()
        if route.namespace is not None:
            metadata.setdefault("namespace", route.namespace)
        name = str(metadata.get("name", ""))
        key = f"{route.namespace}/{name}" if route.resource.namespaced else name
        with self.lock:
            if key in self.store[(route.resource.group, route.resource.plural)]:
                return 409, self._status_body(
                    409,
                    "AlreadyExists",
                    f'{route.resource.qualified} "{name}" already exists',
                    self._details(route, name),
                )
            metadata.pop("resourceVersion", None)
            if dry_run:
                metadata.setdefault("uid", str(uuid.uuid4()))
                metadata.setdefault("creationTimestamp", "2026-12-01T08:00:00Z")
                return 201, self._type_meta(route) + orjson.dumps(
                    {k: v for k, v in body.items() if k not in ("kind", "apiVersion")}
                )[1:]
            stored = self._store(route.resource, body)
        return 201, self._type_meta(route) + stored.body[1:]

    def _replace(self, route: Route, body: Any, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the request body is not an object")
        dry_run = self._dry_run(query or {})
        body = orjson.loads(orjson.dumps(body))  # the recorded request keeps what was sent
        key = f"{route.namespace}/{route.name}" if route.resource.namespaced else str(route.name)
        with self.lock:
            current = self.store[(route.resource.group, route.resource.plural)].get(key)
            if current is None:
                return 404, self._not_found(route)
            edit, times = self._before_update.pop((route.resource.plural, key), (None, 0))
            if edit is not None:
                if times > 1:
                    self._before_update[(route.resource.plural, key)] = (edit, times - 1)
                edited = current.object
                edit(edited)
                current = self._store(route.resource, edited)
            wanted = str((body.get("metadata") or {}).get("resourceVersion") or "")
            stored_version = str(current.object["metadata"]["resourceVersion"])
            if wanted and wanted != stored_version:
                return 409, self._status_body(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {route.resource.qualified} "{route.name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    self._details(route, str(route.name)),
                )
            body["metadata"]["uid"] = current.object["metadata"].get("uid")
            body["metadata"]["creationTimestamp"] = current.object["metadata"].get("creationTimestamp")
            if dry_run:
                body["metadata"]["resourceVersion"] = stored_version
                return 200, self._type_meta(route) + orjson.dumps(
                    {k: v for k, v in body.items() if k not in ("kind", "apiVersion")}
                )[1:]
            stored = self._store(route.resource, body)
        return 200, self._type_meta(route) + stored.body[1:]

    @staticmethod
    def _dry_run(query: Mapping[str, str]) -> bool:
        value = query.get("dryRun")
        if value is None:
            return False
        if value != "All":
            raise BadRequest(f'Invalid dryRun: "{value}": supported values: "All"')
        return True

    def _conflict(self, route: Route) -> dict[str, Any]:
        return self._status_body(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {route.resource.qualified} "{route.name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            self._details(route, str(route.name)),
        )

    def _patch(self, route: Route, query: Mapping[str, str], body: Any, content_type: str) -> tuple[int, Any]:
        if content_type.split(";")[0].strip() != "application/merge-patch+json":
            return 415, self._status_body(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, "
                "application/strategic-merge-patch+json",
            )
        if not isinstance(body, dict):
            raise BadRequest("the request body is not an object")
        dry_run = self._dry_run(query)
        key = f"{route.namespace}/{route.name}" if route.resource.namespaced else str(route.name)
        with self.lock:
            edit = None
            if route.resource.plural == "nodes" and str(route.name) in self._before_patch:
                edit, times = self._before_patch.pop(str(route.name))
                if times > 1:
                    self._before_patch[str(route.name)] = (edit, times - 1)
            current = self.store[(route.resource.group, route.resource.plural)].get(key)
            if current is None:
                return 404, self._not_found(route)
            if edit is not None:
                edited = current.object
                edit(edited)
                current = self._store(route.resource, edited)
            stored_object = current.object
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and str(wanted) != str(stored_object["metadata"]["resourceVersion"]):
                return 409, self._conflict(route)
            merged = merge_patch(stored_object, body)
            problem = self._invalid(route, merged)
            if problem is not None:
                return 422, problem
            if dry_run:
                return 200, self._type_meta(route) + orjson.dumps(merged)[1:]
            merged["metadata"]["uid"] = stored_object["metadata"].get("uid")
            stored = self._store(route.resource, merged)
        return 200, self._type_meta(route) + stored.body[1:]

    def _invalid(self, route: Route, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The 422 Status for an object the apiserver would not store, or None."""
        import kubernetes_validate

        resource = route.resource
        api_version = f"{resource.group}/{route.version}" if resource.group else route.version
        causes: list[dict[str, str]] = []
        try:
            kubernetes_validate.validate(
                {"apiVersion": api_version, "kind": resource.kind, **obj}, "1.37.0", strict=True
            )
        except kubernetes_validate.ValidationError as err:
            causes.append({"reason": "FieldValueInvalid", "message": str(err).splitlines()[0], "field": ""})
        if resource.plural == "nodes":
            seen: set[tuple[str, str]] = set()
            for index, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
                pair = (str(taint.get("key")), str(taint.get("effect")))
                if pair in seen:
                    causes.append(
                        {
                            "reason": "FieldValueDuplicate",
                            "message": f'Duplicate value: "{pair[0]}:{pair[1]}"',
                            "field": f"spec.taints[{index}]",
                        }
                    )
                seen.add(pair)
        if not causes:
            return None
        message = f'{resource.kind} "{route.name}" is invalid: ' + ", ".join(
            f"{c['field']}: {c['message']}" if c["field"] else c["message"] for c in causes
        )
        return self._status_body(422, "Invalid", message, {**self._details(route, str(route.name)), "causes": causes})

    def _evict(self, route: Route, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise BadRequest("the request body is not an Eviction")
        if (body.get("metadata") or {}).get("name") != route.name:
            raise BadRequest("name in URL does not match name in Eviction object")
        dry_run = self._dry_run(query) or (body.get("deleteOptions") or {}).get("dryRun") == ["All"]
        key = f"{route.namespace}/{route.name}"
        with self.lock:
            stored = self.store[("", "pods")].get(key)
            if stored is None:
                return 404, self._not_found(route)
            target = stored.object
            phase = (target.get("status") or {}).get("phase")
            budgets = []
            if phase not in ("Pending", "Succeeded", "Failed"):  # canIgnorePDB
                for pdb_stored in self.store[("policy", "poddisruptionbudgets")].values():
                    pdb = pdb_stored.object
                    if pdb["metadata"].get("namespace") == route.namespace and _selects(
                        (pdb.get("spec") or {}).get("selector"), (target.get("metadata") or {}).get("labels") or {}
                    ):
                        budgets.append(pdb)
            if len(budgets) > 1:
                return 500, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
                    "not support.",
                    "code": 500,
                }
            if budgets:
                pdb = budgets[0]
                name, status = pdb["metadata"]["name"], pdb.setdefault("status", {})
                left = self._budget_refusals.get((str(route.namespace), name))
                if left is not None and left <= 0 and status.get("disruptionsAllowed", 0) == 0:
                    status["disruptionsAllowed"] = 1  # the budget's controller caught up
                    self._budget_refusals.pop((str(route.namespace), name))
                if status.get("disruptionsAllowed", 0) <= 0:
                    if left is not None:
                        self._budget_refusals[(str(route.namespace), name)] = left - 1
                    return 429, self._status_body(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} "
                                    f"healthy pods and has {status.get('currentHealthy', 0)} currently",
                                }
                            ]
                        },
                    )
                if not dry_run:
                    status["disruptionsAllowed"] -= 1
                    status.setdefault("disruptedPods", {})[str(route.name)] = "2026-12-01T09:00:00Z"
                    self._store(
                        self.resources[("policy", "poddisruptionbudgets")],
                        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", **pdb},
                    )
            if not dry_run:
                del self.store[("", "pods")][key]
                self.rv += 1
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # -- Status objects -------------------------------------------------------------------------

    @staticmethod
    def _details(route: Route, name: str) -> dict[str, Any]:
        details: dict[str, Any] = {"name": name, "kind": route.resource.plural}
        if route.resource.group:
            details["group"] = route.resource.group
        return details

    @staticmethod
    def _status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        if details is not None:
            body["details"] = dict(details)
        return body

    def _not_found(self, route: Route) -> dict[str, Any]:
        name = str(route.name)
        return self._status_body(
            404, "NotFound", f'{route.resource.qualified} "{name}" not found', self._details(route, name)
        )

    def _forbidden_body(self, route: Route, verb: str) -> dict[str, Any]:
        resource = route.resource
        where = f'in the namespace "{route.namespace}"' if route.namespace is not None else "at the cluster scope"
        message = (
            f'{resource.qualified} is forbidden: User "system:serviceaccount:rocm-isolation-system:'
            f'rocm-isolation-webhook" cannot {verb} resource "{resource.plural}" in API group "{resource.group}" {where}'
        )
        if route.name is not None:
            message = f'{resource.qualified} "{route.name}" is forbidden: ' + message.split(" is forbidden: ", 1)[1]
        details: dict[str, Any] = {"kind": resource.plural}
        if resource.group:
            details["group"] = resource.group
        if route.name is not None:
            details["name"] = route.name
        return self._status_body(403, "Forbidden", message, details)

    def _status(
        self,
        handler: BaseHTTPRequestHandler,
        code: int,
        reason: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._send(handler, code, self._status_body(code, reason, message, details), headers)

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler, code: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        try:
            handler.send_response(code)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client went away
            pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; nil or empty selects nothing here (as the eviction code reads PDBs)."""
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True
