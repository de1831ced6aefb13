"""Our two DeviceClasses: what they must say, who owns the extended resource name (``amd.com/gpu``), and
what writing them changes.

Pure: ``pool/read.py`` reads the DeviceClasses and passes them in raw; ``pool/write.py`` writes them. The
classes themselves are rendered by ``webhook.deploy.device_classes``.

Why the newest class. The scheduler maps an ``extendedResourceName`` (``amd.com/gpu``) to one DeviceClass:
when several name it, the newest (``creationTimestamp``), then the lower name on a tie
(k8s.io/dynamic-resource-allocation ``extendedresourcecache.updateResourceName2class``, v1.36). AMD's
chart ships ``gpu.amd.com`` naming ``amd.com/gpu``; our shared class must be the one that wins, or
``amd.com/gpu`` pods on DRA nodes may get reserved devices.

Why the shared class records the other classes that name its extended resource
(``ALSO_NAMED_BY_ANNOTATION``). In v1.36, an update that removes the name from a class, or the deletion of
a class naming it, deletes the scheduler's mapping of that name, whichever class it pointed to; an update
event of the class that still names it maps it again. Recording the others makes ``pool apply`` rewrite
the shared class (one update event) exactly when that list changed, and write nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.inventory import parse_time
from webhook.core.policy import Policy
from webhook.deploy import device_classes
from webhook.deploy.device_classes import MANAGED_BY, MANAGED_BY_LABEL, DeviceReservation, reservation_of
from webhook.ops.devices.split import DOCS
from webhook.ops.raw import items, mapping, text
from webhook.ops.reservation import SelectionError

ALSO_NAMED_BY_ANNOTATION = "rocm-isolation.io/extended-resource-also-named-by"


# --- the classes read --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassInfo:
    """What the plan needs of a DeviceClass."""

    name: str
    ours: bool  # labelled app.kubernetes.io/managed-by: rocm-isolation-webhook
    created: str  # creationTimestamp as read
    extended_resource_name: str
    raw: Mapping[str, Any]

    @property
    def created_seconds(self) -> float:
        parsed = parse_time(self.created)
        return parsed.timestamp() if parsed is not None else float("-inf")


def class_info(obj: Mapping[str, Any]) -> ClassInfo:
    metadata = mapping(obj.get("metadata"))
    return ClassInfo(
        name=text(metadata.get("name")),
        ours=mapping(metadata.get("labels")).get(MANAGED_BY_LABEL) == MANAGED_BY,
        created=text(metadata.get("creationTimestamp")),
        extended_resource_name=text(mapping(obj.get("spec")).get("extendedResourceName")),
        raw=obj,
    )


def class_infos(objects: Iterable[Mapping[str, Any]]) -> dict[str, ClassInfo]:
    found = (class_info(obj) for obj in objects)
    return {info.name: info for info in found if info.name}


def winner(claimants: Iterable[ClassInfo]) -> ClassInfo | None:
    """The class the scheduler maps an extended resource name to: the newest, the lower name on a tie."""
    return min(claimants, key=lambda c: (-c.created_seconds, c.name), default=None)


def current_reservation(policy: Policy, classes: Mapping[str, ClassInfo]) -> DeviceReservation | None:
    """The reservation our reserved class records; None when it does not exist (or is not ours)."""
    info = classes.get(policy.spec.reserved_devices.reserved_class_name)
    return reservation_of(info.raw) if info is not None else None


# --- who maps the extended resource ------------------------------------------------------------


@dataclass(frozen=True)
class Ownership:
    """Who maps the policy's extendedResourceName, and whether ``apply`` must re-create the class of ours
    that owns it."""

    name: str  # the extended resource name ("" when the policy sets none)
    shared_class: str  # the class of ours that owns it: the shared class, or the shared-extended one
    others: tuple[ClassInfo, ...]  # the other classes naming it (not one of our classes), newest first
    owner_now: ClassInfo | None
    recreate: bool  # ours exists, names it (or will) and loses to another class: delete and re-create
    # The name has classes of its own (``device_classes.narrows``, or they exist already): the shared
    # class keeps every shared device and names no extended resource.
    extended: bool = False
    # Our classes that name it today and will not (the shared class, when the name moves to its own class).
    moving_from: tuple[str, ...] = ()

    @property
    def others_text(self) -> str:
        return ",".join(sorted(c.name for c in self.others))


def product_classes(policy: Policy) -> tuple[str, ...]:
    """The names of every class ``pool`` writes (whether they exist or not)."""
    devices = policy.spec.reserved_devices
    return (
        devices.reserved_class_name,
        devices.reserved_extended_class_name,
        devices.shared_class_name,
        devices.shared_extended_class_name,
    )


def ownership(policy: Policy, classes: Mapping[str, ClassInfo]) -> Ownership:
    devices = policy.spec.reserved_devices
    name, shared = devices.extended_resource_name, devices.shared_class_name
    if not name:
        return Ownership("", shared, (), None, False)
    products = product_classes(policy)
    others = tuple(
        sorted(
            (c for c in classes.values() if c.name not in products and c.extended_resource_name == name),
            key=lambda c: (-c.created_seconds, c.name),
        )
    )
    own_extended = classes.get(devices.shared_extended_class_name)
    extended = device_classes.narrows(devices.driver, _inherited(others)) or (
        own_extended is not None and own_extended.ours
    )
    owner = devices.shared_extended_class_name if extended else shared
    naming = [c for c in classes.values() if c.name in products and c.extended_resource_name == name]
    owner_now = winner([*others, *naming])
    moving = tuple(sorted(c.name for c in naming if c.name != owner and c.ours))
    ours = classes.get(owner)
    recreate = False
    if ours is not None and ours.ours and others:
        after = winner([*others, ClassInfo(ours.name, True, ours.created, name, ours.raw)])
        recreate = after is not None and after.name != owner
    return Ownership(name, owner, others, owner_now, recreate, extended, moving)


def mapped_elsewhere(policy: Policy, owner: Ownership) -> str | None:
    """What ``owner.name`` maps to when it is not the class of ours that should own it, and what pods asking
    for it get then (None when it maps to that class, or the policy names no extended resource). While the
    name moves to its own classes (``owner.moving_from``) it may still map to the shared class: those pods
    get shared GPUs only, but in any layout the shared class selects, not only what the narrowing class
    (AMD's ``gpu.amd.com-spx``: whole GPUs) admits. Meant for an active reservation."""
    now = owner.owner_now
    if not owner.name or (now is not None and now.name == owner.shared_class):
        return None
    if now is None:
        return f"no DeviceClass names {owner.name}: pods asking for it on DRA nodes get no device"
    head = (
        f"{owner.name} maps to deviceclass/{now.name} (the newest DeviceClass naming it, created "
        f"{now.created or 'at an unknown time'}), not to deviceclass/{owner.shared_class}: pods asking for "
        f"{owner.name} on DRA nodes "
    )
    if not (now.ours and now.name == policy.spec.reserved_devices.shared_class_name):
        return head + "can get GPUs reserved for inference"
    source = inherited(owner)
    if source is None:
        return head + "get shared GPUs only (never reserved ones)"
    if set(source.selectors) <= set(_selectors(now.raw)):
        return head + f"get shared GPUs only (never reserved ones), as deviceclass/{source.name} admits them"
    return head + (
        f"get shared GPUs only (never reserved ones), but in any layout deviceclass/{now.name} selects (a "
        f"partition too), not only what deviceclass/{source.name} admits"
    )


def owner_fix(owner: Ownership) -> str:
    """What ``apply`` does to make the name map to ``owner.shared_class`` (after ``mapped_elsewhere``)."""
    first = (
        f"writes {', '.join('deviceclass/' + name for name in owner.moving_from)} without the name, then "
        if owner.moving_from
        else ""
    )
    return f"{first}makes deviceclass/{owner.shared_class} the newest class naming it"


def ownership_lines(owner: Ownership, *, recreate_planned: bool, creating: bool) -> list[str]:
    """What the scheduler maps the extended resource to, today and after ``apply``."""
    if not owner.name:
        return [
            "No extended resource maps to the shared class: the policy sets no reservedDevices.extendedResourceName, "
            "or the cluster's minor cannot keep one (then a warning says so)."
        ]
    lines = [
        f"{owner.name}: the scheduler maps it to the newest DeviceClass naming it (the lower name on a tie): "
        + (f"deviceclass/{owner.owner_now.name} today." if owner.owner_now else "no class names it today.")
    ]
    for other in owner.others:
        lines.append(
            f"  deviceclass/{other.name} also names {owner.name} (created {other.created or 'at an unknown time'})"
            + ("" if other.ours else "; not ours: pool never edits it")
        )
    if recreate_planned:
        lines.append(
            f"  apply deletes deviceclass/{owner.shared_class} and creates it again, so that it is the newest: it is "
            f"ours and not the class {owner.name} maps to ({owner.name} maps to no class only between the delete "
            "and the create)"
        )
    elif creating:
        lines.append(f"  apply creates deviceclass/{owner.shared_class}, which is then the newest")
    elif owner.recreate:
        lines.append(
            f"  deviceclass/{owner.shared_class} is not the newest; a release deletes nothing: pool apply "
            "--devices-per-node N re-creates it"
        )
    elif owner.owner_now is not None and owner.owner_now.name == owner.shared_class:
        lines.append(f"  deviceclass/{owner.shared_class} is the newest: it keeps {owner.name}")
    if owner.extended:
        source = inherited(owner)
        lines.append(
            f"  {owner.name} has classes of its own: deviceclass/{owner.shared_class} owns it (the shared side AND "
            + (f"the selectors of deviceclass/{source.name}" if source is not None else "what the name admitted")
            + "), inference pods asking for it are given its reserved side's class; the reserved and shared "
            "classes keep every device of their side"
        )
        for name in owner.moving_from:
            lines.append(
                f"  deviceclass/{name} names {owner.name} today: apply writes it without the name first, then "
                f"deviceclass/{owner.shared_class}, whose write maps the name to it"
            )
    if owner.others:
        lines.append(f'  (AMD\'s chart stops its class naming it with deviceClass.extendedResourceName: ""; {DOCS})')
    return lines


def ownership_json(owner: Ownership) -> dict[str, Any]:
    return {
        "name": owner.name or None,
        "ownerNow": owner.owner_now.name if owner.owner_now else None,
        "owner": owner.shared_class if owner.name else None,
        "ownClasses": owner.extended,
        "alsoNamedBy": [{"name": c.name, "created": c.created, "ours": c.ours} for c in owner.others],
        "recreateShared": owner.recreate,
    }


# --- what writing them changes -----------------------------------------------------------------


def inherited(owner: Ownership) -> device_classes.Inherited | None:
    """The class whose extendedResourceName our class takes over: the newest other class naming
    it that is not ours (AMD's ``gpu.amd.com-spx``), with its CEL selectors; None when there is none.
    Read from the cluster at every apply and release (that class keeps naming the name, older than
    ours), so re-applying is idempotent and a release keeps what it admits."""
    return _inherited(owner.others)


def _selectors(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """A DeviceClass's CEL selector expressions."""
    found = (
        str(mapping(mapping(selector).get("cel")).get("expression", ""))
        for selector in items(mapping(obj.get("spec")).get("selectors"))
    )
    return tuple(s for s in found if s)


def _inherited(others: Iterable[ClassInfo]) -> device_classes.Inherited | None:
    for info in others:
        if info.ours:
            continue
        return device_classes.Inherited(info.name, _selectors(info.raw))
    return None


def desired_classes(policy: Policy, reservation: DeviceReservation, owner: Ownership) -> list[dict[str, Any]]:
    """Our classes as ``device_classes`` renders them (the extended resource's own classes too when
    ``owner.extended``), the owner of the extended resource recording the other classes that name it (see
    the module docstring) and keeping the selectors of the one it takes the name over from
    (``inherited``); in the order they are written."""
    rendered = device_classes.classes(policy, reservation, inherited(owner), extended=owner.extended)
    if owner.name:
        for desired in rendered:
            if desired["metadata"]["name"] == owner.shared_class:
                desired["metadata"]["annotations"][ALSO_NAMED_BY_ANNOTATION] = owner.others_text
    # Any other class of ours (the shared class once the name has classes of its own) records nothing:
    # ``replace_body`` drops the annotation it kept from when it owned the name.
    return rendered


# Annotations a class of ours carries only while the desired object says them (the record of the other
# classes naming the extended resource: the class that no longer owns the name drops it).
_OURS_ONLY_WHEN_DESIRED = (ALSO_NAMED_BY_ANNOTATION,)


def replace_body(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PUT body that makes ``current`` say what ``desired`` says (our labels, annotations, selectors and
    extendedResourceName; ``ALSO_NAMED_BY_ANNOTATION`` removed when ``desired`` has none; everything else of it kept, ``resourceVersion`` as read: 409 when it changed), or
    None when it already does."""
    metadata = dict(mapping(current.get("metadata")))
    want_meta = mapping(desired.get("metadata"))
    labels = {**mapping(metadata.get("labels")), **mapping(want_meta.get("labels"))}
    annotations = {**mapping(metadata.get("annotations")), **mapping(want_meta.get("annotations"))}
    for key in _OURS_ONLY_WHEN_DESIRED:
        if key not in mapping(want_meta.get("annotations")):
            annotations.pop(key, None)
    spec = dict(mapping(current.get("spec")))
    want_spec = mapping(desired.get("spec"))
    spec["selectors"] = want_spec.get("selectors")
    if "extendedResourceName" in want_spec:
        spec["extendedResourceName"] = want_spec["extendedResourceName"]
    else:
        spec.pop("extendedResourceName", None)
    if (
        labels == mapping(metadata.get("labels"))
        and annotations == mapping(metadata.get("annotations"))
        and spec == mapping(current.get("spec"))
    ):
        return None
    metadata.pop("managedFields", None)  # absent from an update: the apiserver keeps them
    metadata["labels"], metadata["annotations"] = labels, annotations
    return {"apiVersion": device_classes.API_VERSION, "kind": "DeviceClass", "metadata": metadata, "spec": spec}


def foreign_class_error(name: str, role: str) -> SelectionError:
    return SelectionError(
        f"deviceclass/{name} exists and is not managed by rocm-isolation-webhook (label "
        f"{MANAGED_BY_LABEL}={MANAGED_BY}): pool never edits a class that is not its own. Name another "
        f"{role} class in the policy (reservedDevices.{role}ClassName), or delete that class if it is a leftover"
    )


@dataclass(frozen=True)
class ClassChange:
    name: str
    role: str  # reserved, shared, reserved-extended, shared-extended
    action: str  # create, replace, unchanged, recreate
    desired: dict[str, Any]
    current: Mapping[str, Any] | None


_ROLE_FIELDS = {
    "reserved": "reserved",
    "shared": "shared",
    device_classes.RESERVED_EXTENDED: "reservedExtended",
    device_classes.SHARED_EXTENDED: "sharedExtended",
}


def class_changes(
    rendered: Sequence[dict[str, Any]],
    classes: Mapping[str, ClassInfo],
    owner: Ownership,
    *,
    ensure_owner: bool = True,
) -> tuple[ClassChange, ...]:
    """What writing the classes ``rendered`` (``desired_classes``, in their order) does to ``classes`` as
    read (``ensure_owner``: re-create the owner of the extended resource name when another class wins it);
    SelectionError when a class of that name is not ours."""
    changes = []
    for desired in rendered:
        name = desired["metadata"]["name"]
        role = desired["metadata"]["annotations"][device_classes.ROLE_ANNOTATION]
        info = classes.get(name)
        if info is None:
            action = "create"
        elif not info.ours:
            raise foreign_class_error(name, _ROLE_FIELDS.get(role, role))
        elif name == owner.shared_class and owner.name and owner.recreate and ensure_owner:
            action = "recreate"
        else:
            action = "unchanged" if replace_body(info.raw, desired) is None else "replace"
        changes.append(ClassChange(name, role, action, desired, info.raw if info is not None else None))
    return tuple(changes)


def owner_change(changes: Sequence[ClassChange], owner: Ownership) -> ClassChange | None:
    """The change of the class that owns the extended resource name (None when the policy sets none)."""
    if not owner.name:
        return None
    return next((c for c in changes if c.name == owner.shared_class), None)
