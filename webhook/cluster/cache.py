"""Cluster facts for the engine: namespace labels and reserved nodes, from an in-memory watch cache.

Reflectors (client-go's list-then-watch pattern) run in background threads with the ``kubernetes``
client: Namespaces (their labels), Nodes carrying the reserved label key, and ResourceClaims and
ResourceClaimTemplates (the device classes they request; ``resource.k8s.io`` v1, else the newest
version the cluster serves, none when it serves no DRA). A review never calls the API: it reads the
cache.

- list, then watch from the list's ``resourceVersion`` with bookmarks; every event moves the
  resourceVersion forward, so a watch that ends (server timeout, dropped connection) resumes
  where it stopped; the list is paginated (``limit``/``continue``, 500 per page as client-go's
  reflector), so a collection of 100,000s never sits in memory as one response: only what
  ``extract`` keeps of each object does;
- ``410 Gone`` (as an HTTP status or as an ``ERROR`` event: the resourceVersion is too old) means
  relist; so does the periodic resync;
- any other failure (connection refused, 5xx, a broken stream) is retried with exponential
  backoff, and the cache keeps serving what it has.

Objects are read as plain JSON (``_preload_content=False``), never deserialized into the client's
models: a Node object is large and only its labels matter here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson

from webhook.core import claims
from webhook.core.decision import (
    NO_CLAIMS,
    NO_DEVICE_CLASSES,
    NO_DEVICES,
    ClaimFacts,
    DeviceFacts,
    NamespaceFacts,
    NodeFacts,
)
from webhook.core.policy import Policy

log = logging.getLogger("webhook.cluster")
# A claim's pod read while admitting the claim: the apiserver's webhook timeout bounds the whole review.
POD_READ_SECONDS = 1.0  # the webhook's timeoutSeconds is 2


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


class Metrics(Protocol):
    """What the reflectors report; ``webhook.service.metrics.Metrics`` has it (the cache is below the
    service and does not import it)."""

    @property
    def cluster_watch_restarts(self) -> _Labelled: ...

    @property
    def cluster_synced(self) -> _Labelled: ...


Labels = dict[str, str]
ListCall = Callable[..., Any]


class Gone(Exception):
    """The resourceVersion is too old (HTTP 410): relist."""


class WatchError(Exception):
    """The watch reported an error event other than 410."""


class NotServed(Exception):
    """The cluster serves no version of the API (e.g. no Dynamic Resource Allocation)."""


def _labels(obj: Mapping[str, Any]) -> Labels:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


# What a reflector keeps of each object (None: nothing worth keeping, the object is left out).
Extract = Callable[[Mapping[str, Any]], Any]


class Reflector:
    """Keeps ``items`` equal to the API server's collection, in a thread: name -> what ``extract`` keeps
    (by default the labels), or for a ``namespaced`` collection namespace -> name -> that."""

    def __init__(
        self,
        resource: str,
        list_call: ListCall,
        *,
        extract: Extract = _labels,
        namespaced: bool = False,
        metrics: Metrics | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        resync_seconds: float = 600.0,
        watch_timeout_seconds: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        on_change: Callable[[], None] | None = None,
        on_bytes: Callable[[str, int], None] | None = None,
    ) -> None:
        self.resource = resource
        self._on_bytes = on_bytes  # ("list" | "watch", bytes received): what this reflector costs the apiserver
        self._list_call = list_call
        self.metrics = metrics
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.resync_seconds = resync_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._on_change = on_change
        self._extract = extract
        self.namespaced = namespaced
        self.served = True  # False when the cluster serves no version of the API (NotServed)
        self.items: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.resource_version = ""
        self.last_error: str | None = None
        self.lists = 0  # how many full lists were made (tests, status)
        self._stop = threading.Event()
        self._relist = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.resource}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._close_response()
        if self._thread is not None:
            self._thread.join(timeout)

    def relist(self, label_selector: str | None = None) -> None:
        """Drop the current watch and list again (e.g. the reserved-node label changed)."""
        self.label_selector = label_selector
        self._relist.set()
        self._close_response()

    def _close_response(self) -> None:
        response = self._response
        if response is None:
            return
        try:
            # Unblock a thread waiting in recv() (closing alone can wait on the socket lock).
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                import socket

                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.cluster_watch_restarts.labels(self.resource, reason).inc()

    def _run(self) -> None:
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                self._list()
                backoff = self.backoff_initial
                self._watch_until_resync()
            except Gone:
                self._count("expired")
                log.info("watch expired (410 Gone), relisting", extra={"resource": self.resource})
                continue
            except NotServed:
                # Nothing to know: the collection is empty until the API appears (checked at each resync).
                self._not_served()
                self._stop.wait(self.resync_seconds)
                continue
            except Exception as err:
                if self._stop.is_set():
                    return
                self.last_error = f"{type(err).__name__}: {err}"
                self._count("error")
                log.warning(
                    "list/watch failed, retrying",
                    extra={"resource": self.resource, "error": self.last_error, "retry_in_seconds": round(backoff, 2)},
                )
                self._stop.wait(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, self.backoff_max)

    def _call(self, **kwargs: Any) -> Any:
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        try:
            return self._list_call(_preload_content=False, **kwargs)
        except Exception as err:
            # The client raises ApiException for non-2xx answers; 410 means our resourceVersion expired.
            if getattr(err, "status", None) == 410:
                raise Gone() from None
            raise

    def _not_served(self) -> None:
        with self.lock:
            self.items = {}
        self.served = False
        self.last_error = None
        self.synced.set()
        if self.metrics is not None:
            self.metrics.cluster_synced.labels(self.resource).set(1)
        self._changed()
        log.info("not served by this cluster", extra={"resource": self.resource})

    def _list(self) -> None:
        self._relist.clear()
        items: dict[str, Any] = {}
        token = ""
        while True:
            # A continue token past etcd's compaction answers 410: the whole list starts again (Gone).
            paging: dict[str, Any] = {"limit": self.page_size} if self.page_size else {}
            if token:
                paging["_continue"] = token
            response = self._call(_request_timeout=(10, 60), **paging)
            try:
                status = getattr(response, "status", 200)
                if status == 410:
                    raise Gone()
                data = response.data
                body = orjson.loads(data)
                if self._on_bytes is not None:
                    self._on_bytes("list", len(data))
            finally:
                response.release_conn()
            for obj in body.get("items") or []:
                self._put(items, obj)
            metadata = body.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                break
        with self.lock:
            self.items = items
        self.served = True
        self.resource_version = str(metadata.get("resourceVersion", ""))
        self.lists += 1
        self.last_error = None
        self.synced.set()
        if self.metrics is not None:
            self.metrics.cluster_synced.labels(self.resource).set(1)
        self._changed()
        log.info(
            "listed", extra={"resource": self.resource, "count": self.count, "resource_version": self.resource_version}
        )

    @property
    def count(self) -> int:
        items = self.items
        return sum(len(names) for names in items.values()) if self.namespaced else len(items)

    def values(self, namespace: str | None = None) -> list[Any]:
        """What is kept now, of every namespace or (``namespace``) of one: a copy of the references, taken
        under the lock (the thread replaces an object that changes, never modifies it)."""
        with self.lock:
            if not self.namespaced:
                return list(self.items.values())
            if namespace is not None:
                return list(self.items.get(namespace, {}).values())
            return [obj for names in self.items.values() for obj in names.values()]

    @classmethod
    def frozen(cls, resource: str, objects: Iterable[Mapping[str, Any]], *, namespaced: bool) -> Reflector:
        """A reflector holding ``objects`` as listed, synced, never started (a dumped view read back)."""
        reflector = cls(resource, _never_called, extract=_as_is, namespaced=namespaced)
        for obj in objects:
            reflector._put(reflector.items, obj)
        reflector.synced.set()
        return reflector

    def _put(self, items: dict[str, Any], obj: Mapping[str, Any]) -> None:
        namespace, name = _key(obj)
        if not name:
            return
        value = self._extract(obj)
        target = items.setdefault(namespace, {}) if self.namespaced else items
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value

    def _delete(self, items: dict[str, Any], obj: Mapping[str, Any]) -> None:
        namespace, name = _key(obj)
        target = items.get(namespace, {}) if self.namespaced else items
        target.pop(name, None)

    def _watch_until_resync(self) -> None:
        deadline = threading.Event()

        def resync() -> None:
            deadline.set()
            self._close_response()

        timer = threading.Timer(self.resync_seconds, resync)
        timer.daemon = True
        timer.start()
        try:
            while not (self._stop.is_set() or deadline.is_set() or self._relist.is_set()):
                self._watch_once()
                if not (self._stop.is_set() or deadline.is_set() or self._relist.is_set()):
                    self._count("closed")
        finally:
            timer.cancel()
        if deadline.is_set():
            self._count("resync")

    def _watch_once(self) -> None:
        response = self._call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds,
            _request_timeout=(10, self.watch_timeout_seconds + 30),
        )
        self._response = response
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    return
                if self._on_bytes is not None:
                    self._on_bytes("watch", len(line))
                self._apply(orjson.loads(line))
        except Exception:
            # A stream cut by relist()/stop()/resync is the expected way out, not an error.
            if self._stop.is_set() or self._relist.is_set():
                return
            raise
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone()
            raise WatchError(f"{obj.get('reason', '')}: {obj.get('message', '')} (code {code})")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if version:
                self.resource_version = str(version)
            return
        with self.lock:
            if kind == "DELETED":
                self._delete(self.items, obj)
            elif kind in ("ADDED", "MODIFIED"):
                self._put(self.items, obj)
        if version:
            self.resource_version = str(version)
        self._changed()


def _as_is(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj


def _never_called(**_: Any) -> Any:
    raise RuntimeError("a frozen reflector lists nothing")


class FirstServedVersion:
    """A list/watch call on the first version of an API group the cluster serves (newest first): a
    404 on a version means the cluster does not serve it. Remembered once found."""

    def __init__(self, calls: list[tuple[str, ListCall]]) -> None:
        self._calls = calls
        self.version: str | None = None

    def __call__(self, **kwargs: Any) -> Any:
        for version, call in self._calls:
            if self.version is not None and version != self.version:
                continue
            try:
                response = call(**kwargs)
            except Exception as err:
                if getattr(err, "status", None) == 404 and self.version is None:
                    continue
                raise
            if getattr(response, "status", 200) == 404 and self.version is None:
                response.release_conn()
                continue
            self.version = version
            return response
        raise NotServed()


def _claim_extract(kind: str) -> Extract:
    def extract(obj: Mapping[str, Any]) -> frozenset[str] | None:
        try:
            return claims.device_classes(obj, kind)
        except claims.MalformedClaim as err:
            # The apiserver validates claims, so this is not expected; unknown is the safe answer.
            log.warning(
                "unreadable claim left out", extra={"kind": kind, "claim": "/".join(_key(obj)), "error": str(err)}
            )
            return None

    return extract


def _device_class_extract(obj: Mapping[str, Any]) -> claims.DeviceClassInfo | None:
    try:
        return claims.device_class_info(obj)
    except claims.MalformedClaim as err:
        # Validated by the apiserver, so not expected. Left out: the policy's own names still apply.
        log.warning("unreadable DeviceClass left out", extra={"deviceclass": _key(obj)[1], "error": str(err)})
        return None


def _claim_list_call(api_client: Any, method: str) -> FirstServedVersion:
    from kubernetes import client

    apis = {
        "v1": client.ResourceV1Api,
        "v1beta2": client.ResourceV1beta2Api,
        "v1beta1": client.ResourceV1beta1Api,
    }
    return FirstServedVersion([(version, getattr(apis[version](api_client), method)) for version in claims.VERSIONS])


def _lines(response: Any) -> Iterator[str]:
    from kubernetes.watch.watch import iter_resp_lines

    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
        if line.strip():
            yield line


class ClusterCache:
    """``ClusterFacts`` backed by the reflectors: Namespaces, reserved Nodes, and the Dynamic Resource
    Allocation objects pods can name (ResourceClaims, ResourceClaimTemplates)."""

    def __init__(
        self,
        api_client: Any,
        *,
        reserved_label: tuple[str, str],
        metrics: Metrics | None = None,
        resync_seconds: float = 600.0,
        watch_timeout_seconds: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api_client)
        self._reserved_label = reserved_label
        self._reserved: frozenset[str] | None = None
        self._reserved_lock = threading.Lock()
        common: dict[str, Any] = {
            "metrics": metrics,
            "resync_seconds": resync_seconds,
            "watch_timeout_seconds": watch_timeout_seconds,
            "backoff_initial": backoff_initial,
            "backoff_max": backoff_max,
        }
        self.namespaces = Reflector("namespaces", core.list_namespace, **common)
        self.nodes_reflector = Reflector(
            "nodes", core.list_node, label_selector=reserved_label[0], on_change=self._invalidate, **common
        )
        # Read as raw JSON like the others; only the device classes each one requests are kept.
        self.claims_reflector = Reflector(
            "resourceclaims",
            _claim_list_call(api_client, "list_resource_claim_for_all_namespaces"),
            extract=_claim_extract(claims.CLAIM_KIND),
            namespaced=True,
            **common,
        )
        self.claim_templates_reflector = Reflector(
            "resourceclaimtemplates",
            _claim_list_call(api_client, "list_resource_claim_template_for_all_namespaces"),
            extract=_claim_extract(claims.TEMPLATE_KIND),
            namespaced=True,
            **common,
        )
        # DeviceClasses: which select a GPU driver whatever they are called, and their extendedResourceNames.
        self.device_classes_reflector = Reflector(
            "deviceclasses",
            _claim_list_call(api_client, "list_device_class"),
            extract=_device_class_extract,
            on_change=self._invalidate_devices,
            **common,
        )
        # (generation of the DeviceClasses, the policy they were judged by, the facts): a change bumps the
        # generation, so facts worked out from an older copy are never kept; a reload is a new Policy.
        self._device_generation = 0
        self._devices: tuple[int, Policy, DeviceFacts] | None = None
        self.api_client = api_client
        self._read_pod = core.read_namespaced_pod

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as stored, read live (pods are not watched: too many), None when it cannot be read: the
        caller treats an unknown pod as no borrower, the safe side (a claim then gets shared devices only)."""
        try:
            response: Any = self._read_pod(name, namespace, _preload_content=False, _request_timeout=POD_READ_SECONDS)
            found = orjson.loads(response.data)
        except Exception as err:  # any failure: unknown, never an error of the admission
            log.warning("cannot read a claim's pod", extra={"namespace": namespace, "pod": name, "error": str(err)})
            return None
        return found if isinstance(found, dict) else None

    @property
    def reflectors(self) -> tuple[Reflector, ...]:
        return (
            self.namespaces,
            self.nodes_reflector,
            self.claims_reflector,
            self.claim_templates_reflector,
            self.device_classes_reflector,
        )

    def start(self) -> None:
        for reflector in self.reflectors:
            reflector.start()

    def stop(self) -> None:
        for reflector in self.reflectors:
            reflector.stop()
        close = getattr(self.api_client, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # best effort at shutdown
                close()

    @property
    def synced(self) -> bool:
        return all(reflector.synced.is_set() for reflector in self.reflectors)

    def status(self) -> dict[str, Any]:
        return {
            reflector.resource: {
                "synced": reflector.synced.is_set(),
                "count": reflector.count,
                "resourceVersion": reflector.resource_version,
                **({} if reflector.served else {"served": False}),
                **({"lastError": reflector.last_error} if reflector.last_error else {}),
            }
            for reflector in self.reflectors
        }

    def _invalidate(self) -> None:
        with self._reserved_lock:
            self._reserved = None

    def _invalidate_devices(self) -> None:
        self._device_generation += 1

    def devices(self, policy: Policy) -> DeviceFacts:
        """The cluster's GPU DeviceClasses as the policy's drivers recognise them (worked out once per
        change of the DeviceClasses or of the policy, not per review)."""
        if not self.device_classes_reflector.synced.is_set():
            return NO_DEVICES
        known = self._devices
        if known is not None and known[0] == self._device_generation and known[1] is policy:
            return known[2]
        with self.device_classes_reflector.lock:
            generation = self._device_generation
            classes = dict(self.device_classes_reflector.items)
        facts = claims.device_facts(
            classes, policy.spec.scope.gpu_drivers, policy.spec.reserved_devices.reserved_class_name
        )
        self._devices = (generation, policy, facts)
        return facts

    def namespace(self, name: str) -> NamespaceFacts:
        if not self.namespaces.synced.is_set():
            return NamespaceFacts(name=name, labels=None)
        labels = self.namespaces.items.get(name)
        # A namespace not in the cache yet (created a moment ago, watch lagging) is unknown, not unlabelled.
        return NamespaceFacts(name=name, labels=labels)

    def claims(self, namespace: str) -> ClaimFacts:
        # Until both are listed every claim is unresolvable: the engine counts it as a GPU request.
        if not (self.claims_reflector.synced.is_set() and self.claim_templates_reflector.synced.is_set()):
            return NO_CLAIMS
        return ClaimFacts(
            claims=self.claims_reflector.items.get(namespace, NO_DEVICE_CLASSES),
            templates=self.claim_templates_reflector.items.get(namespace, NO_DEVICE_CLASSES),
        )

    def nodes(self, policy: Policy) -> NodeFacts:
        label = policy.spec.reserved_nodes.label
        if label != self._reserved_label:
            # The policy's reserved label changed (reload): watch the new key, unknown until listed.
            with self._reserved_lock:
                if label != self._reserved_label:
                    self._reserved_label = label
                    self._reserved = None
                    self.nodes_reflector.synced.clear()
                    self.nodes_reflector.relist(label[0])
            return NodeFacts(reserved_node_names=None)
        if not self.nodes_reflector.synced.is_set():
            return NodeFacts(reserved_node_names=None)
        reserved = self._reserved
        if reserved is None:
            key, value = label
            with self.nodes_reflector.lock:
                reserved = frozenset(
                    name for name, labels in self.nodes_reflector.items.items() if labels.get(key) == value
                )
            with self._reserved_lock:
                self._reserved = reserved
        return NodeFacts(reserved_node_names=reserved)


def load_api_client(kubeconfig: str | None, context: str | None = None) -> Any | None:
    """An ApiClient from ``kubeconfig``, else in-cluster configuration, else ``$KUBECONFIG`` or
    ``~/.kube/config``; None when there is no cluster to talk to. ``context`` picks a kubeconfig context
    other than its current-context (as kubectl's ``--context``): with it, in-cluster configuration is not
    used."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = default.split(os.pathsep)[0]
    if first and Path(first).is_file():
        return config.new_client_from_config(config_file=first, context=context)  # type: ignore[no-untyped-call]
    return None


def kubeconfig_available(kubeconfig: str | None) -> bool:
    if kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return Path(default.split(os.pathsep)[0]).is_file()
