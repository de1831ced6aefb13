"""The IsolationPolicy's YAML schema (pydantic) and its validation: every error names the field's path and
what is wrong, so a person can fix the file. ``policy.py`` compiles a validated document."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from webhook.core import rocm
from webhook.core.scheduling import tolerates

API_VERSION = "rocm-isolation.io/v1alpha1"
KIND = "IsolationPolicy"
DEFAULT_POLICY_RESOURCE = "default_policy.yaml"

# AMD GPU operator taints protect unhealthy or re-partitioning GPUs: never tolerate them.
PROTECTED_TAINT_KEYS = frozenset({"amd-gpu-unhealthy", "amd-dcm"})

Mode = Literal["enforce", "warn", "audit"]
Placement = Literal["reserved", "unreserved", "any"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DEVICE_CLASS = re.compile(r"^[a-z0-9*?]([-a-z0-9*?]*[a-z0-9*?])?(\.[a-z0-9*?]([-a-z0-9*?]*[a-z0-9*?])?)*$")


class PolicyError(Exception):
    """The policy file cannot be used; ``problems`` lists each one as ``path: what is wrong``."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid policy:\n  " + "\n  ".join(problems))


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=False, frozen=True, strict=True
    )


def _check_label_key(key: str) -> str:
    if len(key) > 316 or not _LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a valid label key (prefix/name, e.g. example.com/pool)")
    return key


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a valid label value")
    return value


class Taint(_Model):
    key: str
    value: str = ""
    effect: TaintEffect

    @model_validator(mode="after")
    def _valid(self) -> Taint:
        _check_label_key(self.key)
        _check_label_value(self.value)
        return self


class Toleration(_Model):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None

    def tolerates(self, taint: Taint) -> bool:
        return tolerates(self.as_k8s(), taint.key, taint.value, taint.effect)

    def as_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.operator == "Equal":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    @model_validator(mode="after")
    def _valid(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists must not have a value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        return self


class NodeSelectorRequirement(_Model):
    key: str
    # Other spellings of the same node label (the AMD labeller writes both amd.com/X and amd.com/gpu.X);
    # a node carrying any one of them satisfies the requirement.
    key_aliases: list[str] = Field(default_factory=list)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> NodeSelectorRequirement:
        for key in (self.key, *self.key_aliases):
            _check_label_key(key)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()):
            raise ValueError(f"operator {self.operator} takes exactly one integer value")
        return self

    def expression(self, key: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"key": key or self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


class TopologySpread(_Model):
    max_skew: Annotated[int, Field(ge=1)] = 1
    topology_key: str = "kubernetes.io/hostname"
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "DoNotSchedule"
    min_domains: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _valid(self) -> TopologySpread:
        _check_label_key(self.topology_key)
        if self.min_domains is not None and self.when_unsatisfiable != "DoNotSchedule":
            raise ValueError("minDomains is only allowed with whenUnsatisfiable: DoNotSchedule")
        return self


class EnvVar(_Model):
    name: str
    value: str
    # keep: a value the container already sets wins; override: the policy's value wins
    # (use it for anything a pod must not choose for itself, such as priorities).
    on_conflict: Literal["keep", "override"] = "keep"
    # The operator knows ROCm ignores this variable and sets it anyway (e.g. a runbook value):
    # the loader's "no effect" warning is not repeated. Only for variables known to have no effect.
    acknowledge_no_effect: bool = False

    @model_validator(mode="after")
    def _valid(self) -> EnvVar:
        if not _ENV_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a valid environment variable name")
        if self.acknowledge_no_effect and self.name not in rocm.NO_EFFECT_VARIABLES:
            raise ValueError(
                f"acknowledgeNoEffect: {self.name} is not a variable known to have no effect in ROCm "
                f"({', '.join(sorted(rocm.NO_EFFECT_VARIABLES))}); remove the field"
            )
        if self.name == "HSA_CU_MASK":
            errors = rocm.cu_mask_errors(self.value)
            if errors:
                raise ValueError(
                    "HSA_CU_MASK "
                    + repr(self.value)
                    + ": "
                    + "; ".join(errors)
                    + " (ROCm ignores a malformed mask silently, so it is rejected here)"
                )
        return self


class WorkloadClass(_Model):
    placement: Placement
    node_selector_requirements: list[NodeSelectorRequirement] = Field(default_factory=list)
    tolerations: list[Toleration] = Field(default_factory=list)
    topology_spread: TopologySpread | None = None
    env: list[EnvVar] = Field(default_factory=list)
    kfd_topology_mount: bool = False
    # A container that reaches GPUs without the device plugin or DRA (privileged, the AMD container
    # runtime's variables or RuntimeClass) bypasses GPU accounting. isolate: placed and checked like any
    # GPU pod, with a warning; deny: refused in this class.
    direct_gpu_access: Literal["isolate", "deny"] = "isolate"

    @model_validator(mode="after")
    def _valid(self) -> WorkloadClass:
        names = [var.name for var in self.env]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"env sets {', '.join(duplicates)} more than once")
        for tol in self.tolerations:
            if not tol.key and tol.operator == "Exists":
                raise ValueError(
                    "a class toleration must name a key: operator Exists without a key tolerates every taint"
                )
            if tol.key in PROTECTED_TAINT_KEYS:
                raise ValueError(
                    f"tolerating {tol.key} is not allowed: the AMD GPU operator uses it to keep pods off unhealthy "
                    "or re-partitioning GPUs"
                )
        return self


class ReservedNodes(_Model):
    node_selector: dict[str, str] = Field(default_factory=lambda: {"rocm-isolation.io/pool": "inference"})
    taint: Taint | None = None

    @model_validator(mode="after")
    def _valid(self) -> ReservedNodes:
        if len(self.node_selector) != 1:
            raise ValueError("nodeSelector must have exactly one label (key: value) that marks reserved nodes")
        for key, value in self.node_selector.items():
            _check_label_key(key)
            _check_label_value(value)
        return self

    @property
    def label(self) -> tuple[str, str]:
        return next(iter(self.node_selector.items()))


class ReservedDevices(_Model):
    """Device-level reservation (``pool apply --devices-per-node N``): on nodes whose GPUs AMD's DRA driver
    publishes, the N GPUs with the lowest PCI bus IDs of each node go to the class placed on reserved
    nodes, through two DeviceClasses that ``pool`` writes and keeps (their CEL selectors name the reserved
    PCI bus IDs: a class is read at every allocation, so a resize needs no restart). docs/operations.md
    "Device-level reservation"."""

    # The DRA driver whose devices are split (ROCm/k8s-gpu-dra-driver).
    driver: str = "gpu.amd.com"
    # The class of the reserved devices (inference) and the class of the others (every other class);
    # the shared class owns extendedResourceName so that amd.com/gpu on DRA nodes reaches shared devices only.
    reserved_class_name: str = "rocm-isolation-reserved"
    shared_class_name: str = "rocm-isolation-shared"
    # With lending on: the class of the reserved devices that may be lent now (the lending keeper of
    # ``serve`` writes it: the reserved class's selectors while lending is open, none while it is closed);
    # a borrower's claim asks for it after the shared class (firstAvailable). docs/operations.md "Lending".
    lendable_class_name: str = "rocm-isolation-lendable"
    extended_resource_name: str = "amd.com/gpu"
    # When the class that owned extendedResourceName before ours admits less than every device of the
    # driver (AMD's gpu.amd.com-spx under AutoPartition: whole GPUs only), the name gets a class of its own
    # per side, the side's selector AND that class's selectors: the shared one owns the name, the reserved
    # one serves inference pods asking for it (the webhook rewrites their amd.com/gpu to its implicit name).
    # The two classes above then keep every device of their side. docs/operations.md "AutoPartition".
    reserved_extended_class_name: str = "rocm-isolation-reserved-gpu"
    shared_extended_class_name: str = "rocm-isolation-shared-gpu"
    # Whether inference claims may fall back to shared devices when the reserved ones are taken
    # (firstAvailable: reserved first, then shared). Off, as for nodes: inference waits for its devices.
    inference_spillover: bool = False
    # The value of the reserved-nodes label key (reservedNodes.nodeSelector) that ``pool`` gives the nodes
    # whose devices are split: the inference class is placed on nodes labelled with either value (whole
    # reserved nodes or split ones); every other class may use split nodes (they hold the shared devices).
    node_label_value: str = "inference-devices"
    # AMD's AutoPartition: the memory partition mode (``nps1``, ``nps2``, ``nps4``) is node-wide, and the
    # first allocation of a layout sets it (the driver taints the other modes' layouts NoExecute). Set, both
    # classes select only devices of that mode (or without the attribute) while a reservation is active,
    # so neither side can switch the mode the other side's layouts need. docs/operations.md.
    memory_partition: str = ""

    @model_validator(mode="after")
    def _valid(self) -> ReservedDevices:
        if not _DNS_SUBDOMAIN.match(self.driver) or len(self.driver) > 63:
            raise ValueError(f"driver: {self.driver!r} is not a DRA driver name (a DNS subdomain such as gpu.amd.com)")
        for field_name, name in (
            ("reservedClassName", self.reserved_class_name),
            ("sharedClassName", self.shared_class_name),
            ("lendableClassName", self.lendable_class_name),
            ("reservedExtendedClassName", self.reserved_extended_class_name),
            ("sharedExtendedClassName", self.shared_extended_class_name),
        ):
            # deviceclass.resource.kubernetes.io/<name> must be a resource name: its name part is at most 63.
            if not _DEVICE_CLASS.match(name) or any(ch in name for ch in "*?") or len(name) > 63:
                raise ValueError(f"{field_name}: {name!r} is not a DeviceClass name (a DNS subdomain, at most 63)")
        names = (
            self.reserved_class_name,
            self.shared_class_name,
            self.reserved_extended_class_name,
            self.shared_extended_class_name,
            self.lendable_class_name,
        )
        if len(set(names)) != len(names):
            raise ValueError(
                "reservedClassName, sharedClassName, reservedExtendedClassName, sharedExtendedClassName and "
                "lendableClassName must differ"
            )
        _check_label_value(self.node_label_value)
        if self.memory_partition and not re.fullmatch(r"[a-z0-9]{1,16}", self.memory_partition):
            raise ValueError(
                f"memoryPartition: {self.memory_partition!r} is not a memory partition mode (nps1, nps2, nps4), "
                "or '' for none"
            )
        if self.extended_resource_name and not _RESOURCE_NAME.match(self.extended_resource_name):
            raise ValueError(
                f"extendedResourceName: {self.extended_resource_name!r} is not an extended resource name "
                "(domain/name, e.g. amd.com/gpu), or '' for none"
            )
        return self


class Routes(_Model):
    """Which routes to an AMD GPU make a pod a GPU pod (``spec.scope.routes``). Each one can be switched
    off; docs/policy.md says when that is safe (it rarely is: a route left out is a way onto the
    reserved nodes' GPUs that nothing checks)."""

    # resources.requests/limits named in gpuResources or matching gpuResourcePatterns (the device plugin).
    device_plugin: bool = True
    # spec.resourceClaims naming a ResourceClaim(Template) of a GPU DeviceClass (Dynamic Resource Allocation).
    resource_claims: bool = True
    # DRA extended resources (KEP-5004): deviceclass.resource.kubernetes.io/<GPU class>, or the
    # extendedResourceName of a GPU DeviceClass; the scheduler makes the claim after admission.
    dra_extended_resources: bool = True
    # securityContext.privileged of any container (regular, init, ephemeral): it sees every device of the node.
    privileged_containers: bool = True
    # The AMD container runtime's GPU selection variables in a container's env, and runtimeClassNames.
    container_runtime: bool = True


class Scope(_Model):
    gpu_resources: list[str] = Field(default_factory=lambda: ["amd.com/gpu"])
    # Regular expressions (RE2-compatible, searched as CEL's matches() does). The device plugin's names
    # vary (gpu, partitions such as cpx_nps4, gpu_vf/gpu_pf): every name under amd.com/ is a GPU.
    gpu_resource_patterns: list[str] = Field(default_factory=lambda: [r"^amd\.com/"])
    # DRA DeviceClasses that hand out GPUs (exact names or shell-style globs): a pod whose
    # ResourceClaim(Template) requests one of them is a GPU pod. gpu.amd.com: AMD's DRA driver.
    gpu_device_classes: list[str] = Field(default_factory=lambda: ["gpu.amd.com", "gpu.amd.com-*"])
    # DRA drivers that hand out GPUs: a DeviceClass whose selectors name one (or that does not pin a
    # driver at all) is a GPU class too, whatever it is called (webhook.core.claims.selects_driver).
    gpu_drivers: list[str] = Field(default_factory=lambda: ["gpu.amd.com"])
    # extendedResourceNames of GPU DeviceClasses, for what cannot look DeviceClasses up (the webhook's
    # matchConditions, the ValidatingAdmissionPolicy); the webhook and audit also read them from the
    # cluster, and audit reports a GPU DeviceClass whose name is missing here.
    extended_resource_names: list[str] = Field(default_factory=list)
    # The AMD container runtime (ROCm container toolkit) gives the GPUs these variables select to any
    # container it runs, unprivileged: exact names, and prefixes.
    runtime_variables: list[str] = Field(default_factory=lambda: ["AMD_VISIBLE_DEVICES"])
    runtime_variable_prefixes: list[str] = Field(default_factory=lambda: ["DOCKER_RESOURCE_"])
    # RuntimeClasses whose handler is the AMD container runtime: every container of such a pod may get GPUs.
    runtime_class_names: list[str] = Field(default_factory=list)
    routes: Routes = Field(default_factory=Routes)
    all_pods: bool = False

    @model_validator(mode="after")
    def _valid(self) -> Scope:
        for pattern in self.gpu_resource_patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"gpuResourcePatterns: {pattern!r} is not a regular expression: {err}") from None
        for name in self.gpu_device_classes:
            if not name or len(name) > 253 or not _DEVICE_CLASS.match(name):
                raise ValueError(
                    f"gpuDeviceClasses: {name!r} is not a DeviceClass name (a DNS subdomain such as gpu.amd.com; "
                    "* and ? may stand for parts of it)"
                )
        for name in self.gpu_drivers:
            if not name or len(name) > 63 or not _DNS_SUBDOMAIN.match(name):
                raise ValueError(f"gpuDrivers: {name!r} is not a DRA driver name (a DNS subdomain such as gpu.amd.com)")
        for name in self.extended_resource_names:
            if not _RESOURCE_NAME.match(name):
                raise ValueError(
                    f"extendedResourceNames: {name!r} is not an extended resource name (domain/name, e.g. "
                    "example.com/amd-gpu)"
                )
        for name in (*self.runtime_variables, *self.runtime_variable_prefixes):
            if not _ENV_NAME.match(name):
                raise ValueError(
                    f"{name!r} is not an environment variable name (runtimeVariables, runtimeVariablePrefixes)"
                )
        for name in self.runtime_class_names:
            if not _DNS_SUBDOMAIN.match(name):
                raise ValueError(f"runtimeClassNames: {name!r} is not a RuntimeClass name")
        return self


class SpreadSelector(_Model):
    """Which pod labels the added topology spread constraint selects its peers by.

    A constraint counts the pods its selector matches; a label that a controller makes unique per pod
    would make it count only the pod itself (maxSkew always met: nothing spreads)."""

    # Per-pod identity labels: never in the selector.
    excluded_label_keys: list[str] = Field(
        default_factory=lambda: [
            "statefulset.kubernetes.io/pod-name",
            "apps.kubernetes.io/pod-index",
            "batch.kubernetes.io/job-completion-index",
            "leaderworkerset.sigs.k8s.io/worker-index",
            "training.kubeflow.org/replica-index",
        ]
    )
    # Labels whose values the controller chooses per revision or per instance: the constraint lists the
    # keys in matchLabelKeys (the scheduler reads the values from the pod itself), so replicas of one
    # revision count each other and no value is hard-wired.
    match_label_keys: list[str] = Field(
        default_factory=lambda: [
            "pod-template-hash",
            "controller-revision-hash",
            "pod-template-generation",
            "batch.kubernetes.io/controller-uid",
            "controller-uid",
            "batch.kubernetes.io/job-name",
            "job-name",
        ]
    )

    @model_validator(mode="after")
    def _valid(self) -> SpreadSelector:
        for key in (*self.excluded_label_keys, *self.match_label_keys):
            _check_label_key(key)
        both = sorted(set(self.excluded_label_keys) & set(self.match_label_keys))
        if both:
            raise ValueError(f"{', '.join(both)}: a key is either excluded or a matchLabelKey, not both")
        return self


class Labels(_Model):
    namespace_class: str = "rocm-isolation.io/class"
    namespace_mode: str = "rocm-isolation.io/mode"
    pod_class: str = "rocm-isolation.io/workload-class"

    @model_validator(mode="after")
    def _valid(self) -> Labels:
        for key in (self.namespace_class, self.namespace_mode, self.pod_class):
            _check_label_key(key)
        return self


class NamespaceMatch(_Model):
    # Exact names or shell-style globs (inference-*); a namespace matching any of them matches.
    names: list[str] = Field(default_factory=list)
    # Namespace labels that must all be present with these values.
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _valid(self) -> NamespaceMatch:
        if not self.names and not self.labels:
            raise ValueError("a namespace rule must match by names, by labels, or both")
        for key in self.labels:
            _check_label_key(key)
        return self


class NamespaceRule(_Model):
    match: NamespaceMatch
    allowed_classes: list[str]
    default_class: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> NamespaceRule:
        if not self.allowed_classes:
            raise ValueError("allowedClasses must name at least one class")
        if self.default_class is not None and self.default_class not in self.allowed_classes:
            raise ValueError(f"defaultClass {self.default_class!r} is not in allowedClasses")
        return self

    @property
    def effective_default(self) -> str:
        return self.default_class or self.allowed_classes[0]


# The names users see (design.md, "Names users see").
LENDING_NAMESPACE_LABEL = "rocm-isolation.io/lending"
LENDING_ALLOWED = "allowed"
BORROW_POD_LABEL = "rocm-isolation.io/borrow"
NO_BORROWERS_TAINT_KEY = "rocm-isolation.io/no-borrowers"
# Kubernetes refuses user PriorityClasses above one billion (higher values are the system's).
MAX_USER_PRIORITY = 1_000_000_000


class PriorityClassSettings(_Model):
    """A PriorityClass that ``manifests`` renders and the webhook and the placement policy write into pods
    (all three fields: the Priority admission plugin checks the pod again after the mutating webhooks and
    policies, and forbids a name whose value or preemption policy the pod does not carry)."""

    name: str
    value: int
    preemption_policy: Literal["Never", "PreemptLowerPriority"]

    @model_validator(mode="after")
    def _valid(self) -> PriorityClassSettings:
        if not _DNS_SUBDOMAIN.match(self.name) or len(self.name) > 253:
            raise ValueError(f"name: {self.name!r} is not a PriorityClass name (a DNS subdomain)")
        if self.name.startswith("system-"):
            raise ValueError(f"name: {self.name!r}: the system- prefix is reserved by Kubernetes")
        if not -MAX_USER_PRIORITY <= self.value <= MAX_USER_PRIORITY:
            raise ValueError(
                f"value: {self.value} is outside what Kubernetes allows ({-MAX_USER_PRIORITY} to {MAX_USER_PRIORITY})"
            )
        return self


def _borrower_class() -> PriorityClassSettings:
    return PriorityClassSettings.model_validate(
        {"name": "rocm-isolation-borrower", "value": -100, "preemptionPolicy": "Never"}
    )


def _inference_class() -> PriorityClassSettings:
    return PriorityClassSettings.model_validate(
        {"name": "rocm-isolation-inference", "value": 1000, "preemptionPolicy": "PreemptLowerPriority"}
    )


class LendingNamespaces(_Model):
    """Which namespaces may borrow: a namespace labelled ``<labelKey>=allowed`` (the label is guarded like
    the class label: only the class-label editors may set it), or one named here (exact names or globs)."""

    label_key: str = LENDING_NAMESPACE_LABEL
    names: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> LendingNamespaces:
        _check_label_key(self.label_key)
        for name in self.names:
            if not name or len(name) > 63 or not re.match(r"^[-a-z0-9*?\[\]!]+$", name):
                raise ValueError(f"names: {name!r} is not a namespace name or glob")
        return self


class Lending(_Model):
    """Lending idle reserved capacity to preemptible training (off by default; docs/policy.md "Lending")."""

    enabled: bool = False
    namespaces: LendingNamespaces = Field(default_factory=LendingNamespaces)
    # In a namespace that may borrow: does a pod of an unreserved class borrow unless it opts out
    # (pod label <podLabel>: "false")? Off: only pods labelled <podLabel>: "true" borrow.
    default_borrow: bool = False
    pod_label: str = BORROW_POD_LABEL
    # Below every inference pod; Never: a borrower waits for capacity, it never preempts anybody.
    borrower_priority_class: PriorityClassSettings = Field(default_factory=_borrower_class)
    inference_priority_class: PriorityClassSettings = Field(default_factory=_inference_class)
    # The borrowers' terminationGracePeriodSeconds cap when their capacity is taken back.
    reclaim_grace_seconds: Annotated[int, Field(ge=0, le=3600)] = 30
    # Reserved GPUs of each pool never lent (an inference burst binds at once on them).
    headroom_gpus: Annotated[int, Field(ge=0, alias="headroomGPUs")] = 0
    # idleNodes: only reserved nodes with no inference pod; idleGPUs: also the idle GPUs of nodes where
    # inference runs (the runbook's split: the operator's choice of exposure).
    lend_from: Literal["idleNodes", "idleGPUs"] = "idleNodes"
    # The taint of reserved nodes that take no new borrowers (headroom, pausing); inference tolerates it.
    no_borrowers_taint: Taint = Field(
        default_factory=lambda: Taint.model_validate(
            {"key": NO_BORROWERS_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
        )
    )

    @model_validator(mode="after")
    def _valid(self) -> Lending:
        _check_label_key(self.pod_label)
        borrower, inference = self.borrower_priority_class, self.inference_priority_class
        if borrower.name == inference.name:
            raise ValueError("borrowerPriorityClass.name and inferencePriorityClass.name must differ")
        if borrower.value >= inference.value:
            raise ValueError(
                f"borrowerPriorityClass.value ({borrower.value}) must be strictly below inferencePriorityClass.value "
                f"({inference.value}): inference takes its capacity back by preempting borrowers"
            )
        if borrower.preemption_policy != "Never":
            raise ValueError(
                "borrowerPriorityClass.preemptionPolicy must be Never: a borrower waits for capacity, it never "
                "preempts anybody"
            )
        if self.no_borrowers_taint.effect != "NoSchedule":
            raise ValueError(
                "noBorrowersTaint.effect must be NoSchedule (running borrowers are taken back by preemption)"
            )
        return self


class GpuMetrics(_Model):
    """What ``audit`` holds the GPUs' own reports to (AMD's device metrics exporter; issue 48, docs/operations.md
    "The GPUs' own word"). Every field optional; the defaults find the incident (a reserved GPU busy for five
    minutes with no pod) and stay quiet on idle and lightly loaded GPUs."""

    # A GPU is in use at an instant when its gfx activity reaches this, or its VRAM in use reaches vramMB.
    activity_percent: Annotated[float, Field(gt=0, le=100)] = 20.0
    vram_mb: Annotated[float, Field(gt=0, alias="vramMB")] = 1024.0
    # Use counts when it held at every instant of this window (not one sample), with no gap over maxGapSeconds.
    window_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    max_gap_seconds: Annotated[int, Field(ge=1, le=3600)] = 120
    # A node whose newest sample is older than this is stale (its exporter stopped): not judged, never idle.
    stale_seconds: Annotated[int, Field(ge=30, le=86400)] = 300
    # A reserved GPU hotter than this (edge, junction or memory sensor) is a finding. 95 °C: below the
    # Instinct GPUs' throttling, above any GPU merely loaded (the incident's node went from 55 to 82 °C).
    temperature_celsius: Annotated[float, Field(gt=0, le=150)] = 95.0
    # How busy inference is expected to keep a reserved GPU at most (the runbook's 40 %).
    inference_load_percent: Annotated[float, Field(gt=0, le=100)] = 40.0


class PolicySpec(_Model):
    mode: Mode = "enforce"
    scope: Scope = Field(default_factory=Scope)
    excluded_namespaces: list[str] = Field(
        default_factory=lambda: [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "rocm-isolation-system",
            "kube-amd-gpu",
        ]
    )
    reserved_nodes: ReservedNodes = Field(default_factory=ReservedNodes)
    reserved_devices: ReservedDevices = Field(default_factory=ReservedDevices)
    labels: Labels = Field(default_factory=Labels)
    default_class: str = "training"
    spread_selector: SpreadSelector = Field(default_factory=SpreadSelector)
    classes: dict[str, WorkloadClass]
    namespaces: list[NamespaceRule] = Field(default_factory=list)
    lending: Lending = Field(default_factory=Lending)
    gpu_metrics: GpuMetrics = Field(default_factory=GpuMetrics)

    @model_validator(mode="after")
    def _valid(self) -> PolicySpec:
        problems: list[str] = []
        if self.default_class not in self.classes:
            problems.append(
                f"defaultClass: {self.default_class!r} is not one of the classes ({', '.join(self.classes)})"
            )
        for index, rule in enumerate(self.namespaces):
            for name in [*rule.allowed_classes, rule.effective_default]:
                if name not in self.classes:
                    problems.append(f"namespaces[{index}]: class {name!r} is not defined under classes")
        if self.reserved_devices.node_label_value == self.reserved_nodes.label[1]:
            problems.append(
                "reservedDevices.nodeLabelValue must differ from the value of reservedNodes.nodeSelector (a node is "
                "reserved whole or split, never both)"
            )
        taint = self.reserved_nodes.taint
        for name, cls in self.classes.items():
            if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name) or len(name) > 63:
                problems.append(f"classes.{name}: a class name must be a DNS label (it is used as a label value)")
            if cls.placement == "unreserved" and taint is not None:
                for i, tol in enumerate(cls.tolerations):
                    if tol.tolerates(taint):
                        problems.append(
                            f"classes.{name}.tolerations[{i}]: an unreserved class must not tolerate the reserved taint"
                        )
        problems.extend(_lending_problems(self))
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _lending_problems(spec: PolicySpec) -> list[str]:
    lending = spec.lending
    if not lending.enabled:
        return []
    problems = []
    if not any(cls.placement == "reserved" for cls in spec.classes.values()):
        problems.append("lending.enabled: no class is placed on reserved nodes (placement: reserved): nothing to lend")
    taint = spec.reserved_nodes.taint
    if taint is not None and taint.key == lending.no_borrowers_taint.key:
        problems.append("lending.noBorrowersTaint.key must differ from reservedNodes.taint.key")
    for name, cls in spec.classes.items():
        if cls.placement == "unreserved":
            for i, tol in enumerate(cls.tolerations):
                if tol.tolerates(lending.no_borrowers_taint):
                    problems.append(
                        f"classes.{name}.tolerations[{i}]: an unreserved class must not tolerate the no-borrowers taint"
                    )
    return problems


class PolicyMetadata(_Model):
    name: str = "default"


class IsolationPolicy(_Model):
    api_version: Literal["rocm-isolation.io/v1alpha1"]
    kind: Literal["IsolationPolicy"]
    metadata: PolicyMetadata = Field(default_factory=PolicyMetadata)
    spec: PolicySpec
