"""Read a pod (a plain dict) defensively: every accessor checks the type of what it reads.

The apiserver always sends well-typed pods, but the offline ``mutate`` command and hostile
clients may not; a wrong type raises ``MalformedPod`` naming the field, never a KeyError.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

CONTAINER_LISTS = ("initContainers", "containers")
_CONTAINER_FIELDS = tuple((name, f"spec.{name}") for name in CONTAINER_LISTS)
# Ephemeral containers (kubectl debug) are added through pods/ephemeralcontainers, never on CREATE:
# read for GPU routes, never patched.
EPHEMERAL = "ephemeralContainers"
_ALL_CONTAINER_FIELDS = (*_CONTAINER_FIELDS, (EPHEMERAL, f"spec.{EPHEMERAL}"))
# DRA extended resources (KEP-5004): a DeviceClass is requested as this prefix + its name.
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"

# The routes to a GPU (docs/policy.md "GPU routes"); stable names (messages, metrics, audit).
ROUTE_RESOURCE = "resource"
ROUTE_CLAIM = "resource-claim"
ROUTE_PRIVILEGED = "privileged"
ROUTE_RUNTIME_VARIABLE = "runtime-variable"
ROUTE_RUNTIME_CLASS = "runtime-class"
# Routes that bypass the device plugin's and DRA's accounting: the container takes GPUs itself.
DIRECT_ROUTES = frozenset({ROUTE_PRIVILEGED, ROUTE_RUNTIME_VARIABLE, ROUTE_RUNTIME_CLASS})


class MalformedPod(Exception):
    """A field of the pod has a type Kubernetes would never send."""

    def __init__(self, field: str, expected: str) -> None:
        self.field = field
        self.expected = expected
        super().__init__(f"{field} must be {expected}")


def mapping(value: Any, field: str) -> dict[str, Any]:
    """The value as a dict (what JSON decoding gives); absent or null reads as empty.

    Plain dicts all the way down: compiled (mypyc), reads from a ``dict`` are direct calls, while
    reads through the ``Mapping`` protocol are method lookups."""
    if type(value) is dict:  # fast path: what JSON decoding gives (the ABC check below is slow)
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedPod(field, "an object")
    return dict(value)


def sequence(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(field, "a list")
    return value


def string(value: Any, field: str) -> str:
    if type(value) is str:
        return value
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedPod(field, "a string")
    return value


def string_map(value: Any, field: str) -> dict[str, str]:
    """The value as a map of strings (not copied); absent or null reads as empty."""
    checked = mapping(value, field)
    for key, item in checked.items():
        if type(item) is not str and not isinstance(item, str):
            raise MalformedPod(f"{field}[{key}]", "a string")
    return checked


def objects(value: Any, field: str) -> list[tuple[int, dict[str, Any]]]:
    """Index and item of a list whose items must be objects."""
    items = sequence(value, field)
    for item in items:
        if type(item) is not dict:
            break
    else:  # what JSON decoding gives: nothing to check
        return list(enumerate(items))
    # The field name is only formatted for an item that is not a plain dict.
    return [
        (index, item if type(item) is dict else mapping(item, f"{field}[{index}]")) for index, item in enumerate(items)
    ]


class ContainerRef:
    """A container and where it sits in the pod (``containers`` or ``initContainers``, index)."""

    __slots__ = ("body", "list_name", "position")

    def __init__(self, list_name: str, position: int, body: dict[str, Any]) -> None:
        self.list_name: Final = list_name
        self.position: Final = position  # index in its list
        self.body: Final = body

    @property
    def field(self) -> str:
        return f"spec.{self.list_name}[{self.position}]"

    @property
    def pointer(self) -> str:
        # The list names are constants and the index an integer: nothing to escape.
        return f"/spec/{self.list_name}/{self.position}"


def resource_maps(container: ContainerRef) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The ``requests`` and ``limits`` maps of a container (each checked to be an object, or None)."""
    resources = container.body.get("resources")
    if type(resources) is not dict:
        resources = mapping(resources, f"{container.field}.resources")
    requests, limits = resources.get("requests"), resources.get("limits")
    # mapping() only when the value is not a plain dict: the field names are formatted for errors only.
    if requests is not None and type(requests) is not dict:
        requests = mapping(requests, f"{container.field}.resources.requests")
    if limits is not None and type(limits) is not dict:
        limits = mapping(limits, f"{container.field}.resources.limits")
    return requests, limits


class GpuResources:
    """Which resource names are GPUs: the policy's names and patterns, each answer remembered."""

    __slots__ = ("_known", "_patterns")

    def __init__(self, names: Iterable[str], patterns: Iterable[re.Pattern[str]]) -> None:
        self._known: Final[dict[str, bool]] = dict.fromkeys(names, True)
        self._patterns: Final = tuple(patterns)

    def __call__(self, resource: str) -> bool:
        known = self._known.get(resource)
        if known is None:
            known = any(pattern.search(resource) for pattern in self._patterns)
            if len(self._known) < 1024:  # bounded: resource names come from pods
                self._known[resource] = known
        return known

    def any(self, resources: dict[str, Any]) -> bool:
        """Whether any of the names is a GPU (a plain loop: compiled, it beats any() over a generator)."""
        for resource in resources:
            known = self._known.get(resource)
            if known or (known is None and self(resource)):
                return True
        return False


class RouteMatcher:
    """The catalogue of GPU routes, compiled (``policy.route_matcher``, extended by the engine with
    what the cluster knows): which resource names are GPUs (None: no resource route), whether
    privileged containers count, the AMD container runtime's variables and RuntimeClasses."""

    __slots__ = ("privileged", "resources", "runtime_classes", "variable_names", "variable_prefixes")

    def __init__(
        self,
        resources: GpuResources | None,
        privileged: bool,
        variables: tuple[str, ...],
        variable_prefixes: tuple[str, ...],
        runtime_classes: frozenset[str],
    ) -> None:
        self.resources: Final = resources
        self.privileged: Final = privileged
        self.variable_names: Final = frozenset(variables)
        self.variable_prefixes: Final = variable_prefixes
        self.runtime_classes: Final = runtime_classes

    def runtime_variable(self, name: str) -> bool:
        # Read for every env entry of every container: one hash lookup, then str.startswith per prefix
        # (compiled, startswith(str) is a native call where startswith(tuple) is a generic one).
        if name in self.variable_names:
            return True
        for prefix in self.variable_prefixes:  # noqa: SIM110 - a plain loop, for the same reason
            if name.startswith(prefix):
                return True
        return False


class Route:
    """One way a pod reaches a GPU: the route (``ROUTE_*``) and the field that opens it (``detail`` under
    ``container``, or the whole field without one). The field is formatted only when a message needs it:
    every GPU container of every review has a route."""

    __slots__ = ("container", "detail", "kind")

    def __init__(self, kind: str, detail: str, container: ContainerRef | None = None) -> None:
        self.kind: Final = kind
        self.detail: Final = detail
        self.container: Final = container

    @property
    def field(self) -> str:
        return self.detail if self.container is None else self.container.field + self.detail

    @property
    def direct(self) -> bool:
        return self.kind in DIRECT_ROUTES

    def describe(self) -> str:
        return ROUTE_WORDS.get(self.kind, self.kind)

    def __repr__(self) -> str:
        return f"Route(kind={self.kind!r}, field={self.field!r})"


ROUTE_WORDS = {
    ROUTE_RESOURCE: "a GPU resource",
    ROUTE_CLAIM: "a DRA claim of a GPU DeviceClass",
    ROUTE_PRIVILEGED: "a privileged container sees every GPU of its node",
    ROUTE_RUNTIME_VARIABLE: "the AMD container runtime hands the GPUs this variable selects to the container",
    ROUTE_RUNTIME_CLASS: "the AMD container runtime may hand GPUs to every container of the pod",
}


def _gpu_resource(container: ContainerRef, gpu: GpuResources) -> bool:
    requests, limits = resource_maps(container)
    return bool((requests and gpu.any(requests)) or (limits and gpu.any(limits)))


def _runtime_variable(container: ContainerRef, matcher: RouteMatcher) -> str:
    """``.env[i](NAME)`` of the first variable of the AMD container runtime ('' when none)."""
    env = container.body.get("env")
    if env is None:
        return ""
    if type(env) is not list:
        env = sequence(env, f"{container.field}.env")
    # A plain loop over what JSON decoding gives: env lists of a hundred variables are common, and this
    # reads every one of every container (field names are only formatted for a hit or a bad item). Typed
    # locals: compiled, dict.get and the str method are native calls, not generic ones.
    for index, item in enumerate(env):
        entry: dict[str, Any] = item if type(item) is dict else mapping(item, f"{container.field}.env[{index}]")
        value = entry.get("name")
        # Whatever the value or valueFrom: the runtime reads the variable the container ends up with.
        if type(value) is str:
            name: str = value
            if matcher.runtime_variable(name):
                return f".env[{index}]({name})"
    return ""


def _privileged(container: ContainerRef) -> str:
    context = container.body.get("securityContext")
    if context is None:
        return ""
    if type(context) is not dict:
        context = mapping(context, f"{container.field}.securityContext")
    value = context.get("privileged")
    if value is True:
        return ".securityContext.privileged"
    if value is not None and type(value) is not bool:
        raise MalformedPod(f"{container.field}.securityContext.privileged", "a boolean")
    return ""


def container_routes(container: ContainerRef, matcher: RouteMatcher, *, complete: bool = True) -> list[Route]:
    """The routes by which one container reaches a GPU (resources, privileged, runtime variables).

    ``complete=False`` skips the scan of the env for the AMD runtime's variables when a GPU resource or
    ``privileged`` already makes the container a GPU container: the scan reads every variable of every
    container (the costliest part of a large pod's decision), and for such a container it only adds a
    warning (the engine reads it where a class denies direct access: ``unscanned_runtime_routes``)."""
    found: list[Route] = []
    gpu = matcher.resources
    if gpu is not None and container.body.get("resources") is not None and _gpu_resource(container, gpu):
        found.append(Route(ROUTE_RESOURCE, ".resources", container))
    if matcher.privileged:
        where = _privileged(container)
        if where:
            found.append(Route(ROUTE_PRIVILEGED, where, container))
    if (complete or not found) and (matcher.variable_names or matcher.variable_prefixes):
        where = _runtime_variable(container, matcher)
        if where:
            found.append(Route(ROUTE_RUNTIME_VARIABLE, where, container))
    return found


def unscanned_runtime_routes(routes: list[Route], matcher: RouteMatcher) -> list[Route]:
    """The runtime-variable routes that ``gpu_routes`` left unread: those of the containers a GPU resource
    already made GPU containers (read only where a class denies direct access)."""
    found: list[Route] = []
    if not (matcher.variable_names or matcher.variable_prefixes):
        return found
    for route in routes:
        container = route.container
        if route.kind == ROUTE_RESOURCE and container is not None:
            where = _runtime_variable(container, matcher)  # the one check the partial scan left out
            if where:
                found.append(Route(ROUTE_RUNTIME_VARIABLE, where, container))
    return found


def containers(spec: dict[str, Any], *, ephemeral: bool = False) -> list[ContainerRef]:
    """The pod's containers in pod order (init containers first; ephemeral ones last, when asked for)."""
    found = []
    for list_name, field in _ALL_CONTAINER_FIELDS if ephemeral else _CONTAINER_FIELDS:
        value = spec.get(list_name)
        if value is None:
            continue
        for index, body in objects(value, field):
            found.append(ContainerRef(list_name, index, body))
    return found


def gpu_routes(spec: dict[str, Any], matcher: RouteMatcher) -> tuple[list[ContainerRef], list[Route]]:
    """The containers that reach a GPU (the ones a class's env and mounts go to) and every route found,
    ephemeral containers' included (they are never patched). A RuntimeClass of the AMD runtime reaches
    GPUs for the whole pod: every container is then a GPU container."""
    found: list[ContainerRef] = []
    routes: list[Route] = []
    for container in containers(spec, ephemeral=True):
        hits = container_routes(container, matcher, complete=False)
        if hits:
            routes.extend(hits)
            if container.list_name != EPHEMERAL:
                found.append(container)
    if matcher.runtime_classes:
        runtime_class = string(spec.get("runtimeClassName"), "spec.runtimeClassName")
        if runtime_class in matcher.runtime_classes:
            routes.append(Route(ROUTE_RUNTIME_CLASS, "spec.runtimeClassName"))
            found = containers(spec)
    return found, routes


class ClaimRef:
    """One entry of ``spec.resourceClaims``: the name containers use, and the ResourceClaim or
    ResourceClaimTemplate it names (exactly one of the two, when the pod is valid)."""

    __slots__ = ("claim_name", "index", "name", "template_name")

    def __init__(self, index: int, name: str, claim_name: str, template_name: str) -> None:
        self.index: Final = index
        self.name: Final = name
        self.claim_name: Final = claim_name
        self.template_name: Final = template_name

    @property
    def field(self) -> str:
        return f"spec.resourceClaims[{self.index}]"


def resource_claims(value: Any) -> list[ClaimRef]:
    """The pod's ``spec.resourceClaims`` (Dynamic Resource Allocation), each field type-checked."""
    found = []
    for index, entry in objects(value, "spec.resourceClaims"):
        field = f"spec.resourceClaims[{index}]"
        found.append(
            ClaimRef(
                index,
                string(entry.get("name"), f"{field}.name"),
                string(entry.get("resourceClaimName"), f"{field}.resourceClaimName"),
                string(entry.get("resourceClaimTemplateName"), f"{field}.resourceClaimTemplateName"),
            )
        )
    return found


def claim_containers(spec: dict[str, Any], claim_names: set[str], found: list[ContainerRef]) -> list[ContainerRef]:
    """``found`` plus the containers whose ``resources.claims`` name one of ``claim_names``."""
    have = {(c.list_name, c.position) for c in found}
    out = list(found)
    for list_name, field in _CONTAINER_FIELDS:
        for index, body in objects(spec.get(list_name), field):
            if (list_name, index) in have:
                continue
            container = ContainerRef(list_name, index, body)
            resources = mapping(body.get("resources"), f"{container.field}.resources")
            for j, claim in objects(resources.get("claims"), f"{container.field}.resources.claims"):
                if string(claim.get("name"), f"{container.field}.resources.claims[{j}].name") in claim_names:
                    out.append(container)
                    break
    # In pod order (init containers first), as gpu_routes lists them.
    order = {name: i for i, name in enumerate(CONTAINER_LISTS)}
    out.sort(key=lambda c: (order[c.list_name], c.position))
    return out


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or its generateName prefix (names are empty on CREATE with generateName)."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name") or ""
    if not name and isinstance(metadata.get("generateName"), str):
        return str(metadata["generateName"])
    return name if isinstance(name, str) else ""
