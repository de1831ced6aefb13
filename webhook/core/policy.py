"""The IsolationPolicy compiled: read, validated (``policy_model.py``, the schema), and compiled.

A policy is loaded once and compiled (regexes, lookup tables) so that ``decide`` does no parsing.
Every validation error names the field's path and what is wrong, so a person can fix the file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from webhook.core import rocm
from webhook.core.pods import DEVICE_CLASS_RESOURCE_PREFIX, GpuResources, RouteMatcher
from webhook.core.policy_model import API_VERSION as API_VERSION
from webhook.core.policy_model import BORROW_POD_LABEL as BORROW_POD_LABEL
from webhook.core.policy_model import DEFAULT_POLICY_RESOURCE as DEFAULT_POLICY_RESOURCE
from webhook.core.policy_model import KIND as KIND
from webhook.core.policy_model import LENDING_ALLOWED as LENDING_ALLOWED
from webhook.core.policy_model import LENDING_NAMESPACE_LABEL as LENDING_NAMESPACE_LABEL
from webhook.core.policy_model import MAX_USER_PRIORITY as MAX_USER_PRIORITY
from webhook.core.policy_model import NO_BORROWERS_TAINT_KEY as NO_BORROWERS_TAINT_KEY
from webhook.core.policy_model import PROTECTED_TAINT_KEYS as PROTECTED_TAINT_KEYS
from webhook.core.policy_model import EnvVar as EnvVar
from webhook.core.policy_model import IsolationPolicy as IsolationPolicy
from webhook.core.policy_model import Labels as Labels
from webhook.core.policy_model import Lending as Lending
from webhook.core.policy_model import LendingNamespaces as LendingNamespaces
from webhook.core.policy_model import Mode as Mode
from webhook.core.policy_model import NamespaceMatch as NamespaceMatch
from webhook.core.policy_model import NamespaceRule as NamespaceRule
from webhook.core.policy_model import NodeSelectorRequirement as NodeSelectorRequirement
from webhook.core.policy_model import Placement as Placement
from webhook.core.policy_model import PolicyError as PolicyError
from webhook.core.policy_model import PolicyMetadata as PolicyMetadata
from webhook.core.policy_model import PolicySpec as PolicySpec
from webhook.core.policy_model import PriorityClassSettings as PriorityClassSettings
from webhook.core.policy_model import ReservedDevices as ReservedDevices
from webhook.core.policy_model import ReservedNodes as ReservedNodes
from webhook.core.policy_model import Routes as Routes
from webhook.core.policy_model import Scope as Scope
from webhook.core.policy_model import SpreadSelector as SpreadSelector
from webhook.core.policy_model import Taint as Taint
from webhook.core.policy_model import TaintEffect as TaintEffect
from webhook.core.policy_model import Toleration as Toleration
from webhook.core.policy_model import TopologySpread as TopologySpread
from webhook.core.policy_model import WorkloadClass as WorkloadClass


@dataclass(frozen=True)
class NamespaceClasses:
    """What a namespace may run: the classes it allows and the one its pods get by default."""

    allowed: tuple[str, ...]
    default: str
    source: str  # how it was decided, for messages: 'rule namespaces[2]', 'label ...', 'defaultClass'


@dataclass(frozen=True, eq=False)
class Policy:
    """A validated, compiled policy. Immutable: a reload builds a new one."""

    document: IsolationPolicy
    source: str
    digest: str
    warnings: tuple[str, ...] = ()
    # Per namespace rule, its names and globs as one pattern (None: the rule matches by labels only).
    _name_patterns: tuple[re.Pattern[str] | None, ...] = field(default=(), repr=False)
    # Which resource names are GPUs by the policy alone (compiled, remembered per name): the device
    # plugin's names and the DRA extended resources the policy names (the engine adds the cluster's).
    gpu: GpuResources = field(default_factory=lambda: GpuResources((), ()), repr=False)
    # The whole catalogue of GPU routes, by the policy alone (the engine extends it with DeviceFacts).
    catalogue: RouteCatalogue = field(
        default_factory=lambda: route_catalogue(PolicySpec.model_construct(classes={})), repr=False
    )
    routes: RouteMatcher = field(default_factory=lambda: RouteMatcher(None, False, (), (), frozenset()), repr=False)
    # Which DRA DeviceClasses are GPUs (same matcher: exact names, then the globs as patterns).
    gpu_device_classes: GpuResources = field(default_factory=lambda: GpuResources((), ()), repr=False)
    # document.spec, read for every review: an attribute, not a property.
    spec: PolicySpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", self.document.spec)

    @property
    def name(self) -> str:
        return self.document.metadata.name

    def is_gpu_resource(self, resource: str) -> bool:
        return self.gpu(resource)

    def namespace_classes(self, namespace: str, labels: Mapping[str, str] | None) -> NamespaceClasses:
        """The first namespace rule that matches, then the class label, then ``defaultClass``.

        ``labels`` is None when the namespace's labels are unknown (no cluster connection): rules that
        need labels cannot match then, which falls back to the default class (never to reserved nodes).
        """
        label_key = frozenset(labels.items()) if labels is not None else None
        return _namespace_classes(self, namespace, label_key)

    def _match_rules(self, namespace: str, labels: frozenset[tuple[str, str]] | None) -> int | None:
        for index, (rule, names) in enumerate(zip(self.spec.namespaces, self._name_patterns, strict=True)):
            if names is not None and not names.match(namespace):
                continue
            if rule.match.labels and (labels is None or not set(rule.match.labels.items()) <= labels):
                continue
            return index
        return None


@lru_cache(maxsize=4096)
def _namespace_classes(policy: Policy, namespace: str, labels: frozenset[tuple[str, str]] | None) -> NamespaceClasses:
    spec = policy.spec
    index = policy._match_rules(namespace, labels)
    if index is not None:
        rule = spec.namespaces[index]
        return NamespaceClasses(tuple(rule.allowed_classes), rule.effective_default, f"policy rule namespaces[{index}]")
    if labels is not None:
        value = dict(labels).get(spec.labels.namespace_class)
        if value is not None and value in spec.classes:
            return NamespaceClasses((value,), value, f"namespace label {spec.labels.namespace_class}={value}")
    return NamespaceClasses((spec.default_class,), spec.default_class, "the policy's defaultClass")


def _names_regex(names: list[str]) -> re.Pattern[str] | None:
    """Exact names and shell-style globs as one anchored pattern (fnmatch escapes exact names)."""
    return re.compile("|".join(fnmatch.translate(name) for name in names)) if names else None


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and not str(part).startswith("function-"):
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _policy_warnings(doc: IsolationPolicy) -> list[str]:
    warnings: list[str] = []
    for name, cls in doc.spec.classes.items():
        for i, var in enumerate(cls.env):
            for text in rocm.variable_warnings(var.name, var.value, acknowledged=var.acknowledge_no_effect):
                warnings.append(f"spec.classes.{name}.env[{i}] ({var.name}): {text}")
        if cls.kfd_topology_mount:
            warnings.append(
                f"spec.classes.{name}.kfdTopologyMount: ROCm does not need this hostPath mount (the device plugin "
                "already exposes /dev/kfd and the render nodes); it is skipped in Pod Security baseline/restricted "
                "namespaces"
            )
    lending = doc.spec.lending
    if lending.enabled and lending.borrower_priority_class.value >= 0:
        warnings.append(
            f"spec.lending.borrowerPriorityClass.value is {lending.borrower_priority_class.value}: pods without a "
            "PriorityClass (priority 0) are not above borrowers; the webhook gives such inference pods "
            f"{lending.inference_priority_class.name}, but other pods do not outrank borrowers (use a negative value)"
        )
    return warnings


def compile_policy(doc: IsolationPolicy, *, source: str, text: str = "") -> Policy:
    digest = hashlib.sha256((text or doc.model_dump_json()).encode()).hexdigest()
    catalogue = route_catalogue(doc.spec)
    return Policy(
        document=doc,
        source=source,
        digest=digest,
        warnings=tuple(_policy_warnings(doc)),
        _name_patterns=tuple(_names_regex(rule.match.names) for rule in doc.spec.namespaces),
        gpu=gpu_resource_matcher(catalogue),
        gpu_device_classes=_device_class_matcher(gpu_device_class_names(doc.spec)),
        catalogue=catalogue,
        routes=route_matcher(catalogue),
    )


@dataclass(frozen=True)
class RouteCatalogue:
    """The GPU routes of a policy as plain data: the one definition that the engine compiles
    (``route_matcher``) and that ``webhook.deploy.cel`` renders into the apiserver's CEL, so both read a pod
    the same way (tests/deploy/test_cel.py proves it on every fixture)."""

    resource_names: tuple[str, ...]  # exact resource names
    resource_patterns: tuple[str, ...]  # RE2-compatible regular expressions, searched (CEL's matches())
    resource_claims: bool  # spec.resourceClaims (CEL cannot read the claim: any claim counts there)
    privileged: bool
    runtime_variables: tuple[str, ...]
    runtime_variable_prefixes: tuple[str, ...]
    runtime_class_names: tuple[str, ...]


def gpu_device_class_names(spec: PolicySpec) -> list[str]:
    """The GPU DeviceClasses of a policy: ``scope.gpuDeviceClasses`` and the classes of device-level
    reservation (``reservedDevices``), which hand out the driver's GPUs whatever the scope says (with lending
    on, the lendable one too)."""
    devices = spec.reserved_devices
    ours = [
        devices.reserved_class_name,
        devices.shared_class_name,
        devices.reserved_extended_class_name,
        devices.shared_extended_class_name,
    ]
    if spec.lending.enabled:
        ours.append(devices.lendable_class_name)
    return list(dict.fromkeys([*spec.scope.gpu_device_classes, *ours]))


def route_catalogue(spec: PolicySpec, cluster_names: Iterable[str] = ()) -> RouteCatalogue:
    """The catalogue, each route as it is switched on. ``cluster_names``: resource names the cluster's
    DeviceClasses add (DeviceFacts: extendedResourceNames, deviceclass.resource.kubernetes.io/<class>)."""
    scope = spec.scope
    routes = scope.routes
    names: list[str] = []
    patterns: list[str] = []
    if routes.device_plugin:
        names.extend(scope.gpu_resources)
        patterns.extend(scope.gpu_resource_patterns)
    if routes.dra_extended_resources:
        names.extend(scope.extended_resource_names)
        names.extend(cluster_names)
        prefix = re.escape(DEVICE_CLASS_RESOURCE_PREFIX)
        for name in gpu_device_class_names(spec):
            if any(ch in name for ch in "*?"):
                patterns.append("^" + prefix + glob_regex(name)[1:])
            else:
                names.append(DEVICE_CLASS_RESOURCE_PREFIX + name)
    runtime = routes.container_runtime
    return RouteCatalogue(
        resource_names=tuple(dict.fromkeys(names)),
        resource_patterns=tuple(dict.fromkeys(patterns)),
        resource_claims=routes.resource_claims,
        privileged=routes.privileged_containers,
        runtime_variables=tuple(scope.runtime_variables) if runtime else (),
        runtime_variable_prefixes=tuple(scope.runtime_variable_prefixes) if runtime else (),
        runtime_class_names=tuple(scope.runtime_class_names) if runtime else (),
    )


def gpu_resource_matcher(catalogue: RouteCatalogue) -> GpuResources:
    return GpuResources(catalogue.resource_names, [re.compile(p) for p in catalogue.resource_patterns])


def route_matcher(catalogue: RouteCatalogue) -> RouteMatcher:
    return RouteMatcher(
        gpu_resource_matcher(catalogue) if (catalogue.resource_names or catalogue.resource_patterns) else None,
        catalogue.privileged,
        catalogue.runtime_variables,
        catalogue.runtime_variable_prefixes,
        frozenset(catalogue.runtime_class_names),
    )


def glob_regex(pattern: str) -> str:
    """A shell glob (fnmatch: ``*``, ``?``, ``[...]``, ``[!...]``) as an anchored RE2 expression (also a
    Python one: the engine and the apiserver's CEL match with the same string)."""
    out = ["^"]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            # The closing bracket as fnmatch finds it: a leading "!" or "]" belongs to the set.
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append("\\[")
                continue
            body = pattern[i:j].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"[{body}]")
            i = j + 1
        else:
            out.append(ch if ch.isalnum() or ch in "-_" else re.escape(ch))
    out.append("$")
    return "".join(out)


def _device_class_matcher(names: list[str]) -> GpuResources:
    exact = [name for name in names if not any(ch in name for ch in "*?")]
    # Anchored at the start too: GpuResources searches its patterns.
    globs = [re.compile("^" + fnmatch.translate(name)) for name in names if name not in exact]
    return GpuResources(exact, globs)


def parse_policy(text: str, *, source: str = "<policy>") -> Policy:
    """Parse and validate policy YAML; raise PolicyError with one line per problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise PolicyError(source, [f"{where}not valid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        raise PolicyError(source, ["the file must hold one YAML mapping (apiVersion, kind, spec)"])
    try:
        doc = IsolationPolicy.model_validate(data)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{_format_location(tuple(error['loc']))}: {message}")
        raise PolicyError(source, problems) from None
    return compile_policy(doc, source=source, text=text)


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PolicyError(str(path), [f"cannot read the file: {err}"]) from None
    return parse_policy(text, source=str(path))


def default_policy_text() -> str:
    return resources.files("webhook").joinpath(DEFAULT_POLICY_RESOURCE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def default_policy() -> Policy:
    return parse_policy(default_policy_text(), source="<built-in default policy>")
