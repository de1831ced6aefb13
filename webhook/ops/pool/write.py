"""Every write of ``pool``, and the only module of it that calls the API's write verbs: nodes patched (our
label and taint, the split label; 409 → read the node again and retry), pods evicted, the backstop's
reserved-names ConfigMap synced, our DeviceClasses and DeviceTaintRules created, replaced, re-created or
deleted (``write_split``: in the order that never gives training a reserved device in between); and the
line or JSON each write reports.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.kubeapi import ApiError, Conflict, KubeApi, NotFound, api_path
from webhook.core import claims as dra
from webhook.core.policy import Policy
from webhook.deploy import device_classes, device_taint_rules, reserved_names
from webhook.ops.devices.ownership import ClassChange, ClassInfo, Ownership, class_info, replace_body, winner
from webhook.ops.devices.plan import DevicePlan, RuleChange, plan_lines
from webhook.ops.devices.split import split_label_patch, unsplit_label_patch
from webhook.ops.pool import reserved_names as reserved_names_sync
from webhook.ops.pool.eviction import EvictionResult, evict_pods, eviction_body
from webhook.ops.pool.output import Output
from webhook.ops.pool.read import Cluster, read_node
from webhook.ops.reservation import PoolNode, PoolPod

CONFLICT_RETRIES = 5


# creationTimestamp has a resolution of one second: a new shared class that ties with another class naming
# its extended resource, and loses the tie by name, is re-created once the second has passed.
CREATION_TICK = 1.0


RECREATE_ATTEMPTS = 3


EVICTION_BACKOFF = (1.0, 16.0)  # seconds: the first wait after a refusal, and the longest


# --- nodes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    node: str
    result: str  # "patched", "unchanged", "conflict" (kept changing), "gone" (deleted meanwhile)
    patch: dict[str, Any] | None
    attempts: int


def write_node(
    api: KubeApi,
    node: PoolNode,
    make_patch: Callable[[PoolNode], dict[str, Any] | None],
    policy: Policy,
    *,
    dry_run: bool,
) -> Written:
    """Patch ``node``; on 409 (it changed since it was read) read it again and rebuild the patch."""
    path = api_path("v1", "nodes", name=node.name)
    patch = make_patch(node)
    for attempt in range(1, CONFLICT_RETRIES + 1):
        if patch is None:
            return Written(node.name, "unchanged", None, attempt - 1)
        try:
            api.patch(path, patch, dry_run=dry_run)
            return Written(node.name, "patched", patch, attempt)
        except Conflict:
            try:
                node = read_node(api, node.name, policy)
            except NotFound:
                return Written(node.name, "gone", None, attempt)
            patch = make_patch(node)
        except NotFound:
            return Written(node.name, "gone", None, attempt)
    return Written(node.name, "conflict", patch, CONFLICT_RETRIES)


def written_line(written: Written, verb: str, dry_run: bool) -> str:
    suffix = " (server dry run)" if dry_run else ""
    if written.result == "patched":
        return f"node/{written.node} {verb}{suffix}"
    if written.result == "unchanged":
        return f"node/{written.node} unchanged"
    if written.result == "gone":
        return f"node/{written.node} not found: deleted meanwhile"
    return f"node/{written.node} not changed: it kept changing under us ({written.attempts} conflicts)"


def reserve_verb(patch: Mapping[str, Any]) -> str:
    labelled = "labels" in patch.get("metadata", {})
    tainted = "spec" in patch
    return "labeled and tainted" if labelled and tainted else "labeled" if labelled else "tainted"


def nodes_json(written: Iterable[Written]) -> list[dict[str, Any]]:
    return [{"name": w.node, "result": w.result, "patch": w.patch} for w in written]


# --- evictions ---------------------------------------------------------------------------------


def evictor(api: KubeApi, *, dry_run: bool) -> Callable[[PoolPod], tuple[int, Mapping[str, Any]]]:
    def evict(pod: PoolPod) -> tuple[int, Mapping[str, Any]]:
        path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="eviction")
        try:
            api.post(path, eviction_body(pod, dry_run=dry_run), dry_run=dry_run)
        except ApiError as err:
            if not err.status:
                raise  # unreachable: exit 2, with what was done so far already printed
            return err.status, {"message": err.message, "reason": err.reason, "details": dict(err.details)}
        return 201, {}

    return evict


def eviction_line(result: EvictionResult) -> str:
    pod = f"pod/{result.pod.name} -n {result.pod.namespace}"
    if result.outcome == "refused":
        return f"{pod} not evicted: {result.message} (still refused after {result.attempts} attempts)"
    if result.outcome == "failed":
        return f"{pod} not evicted: {result.message}"
    if result.outcome == "skipped":
        return f"{pod} skipped: {result.message}"
    return f"{pod} {result.message}"


def evict(
    api: KubeApi, pods: Sequence[PoolPod], args: argparse.Namespace, out: Output, *, dry_run: bool, table: bool
) -> list[EvictionResult]:
    """``apply --evict``: evict ``pods``, retrying what a PodDisruptionBudget refuses until ``--timeout``."""
    return evict_pods(
        pods,
        evictor(api, dry_run=dry_run),
        timeout=args.timeout,
        backoff_initial=EVICTION_BACKOFF[0],
        backoff_max=EVICTION_BACKOFF[1],
        on_result=(lambda r: out.line(eviction_line(r))) if table else None,
    )


def evictions_json(evictions: Iterable[EvictionResult]) -> list[dict[str, Any]]:
    return [
        {
            "namespace": e.pod.namespace,
            "name": e.pod.name,
            "outcome": e.outcome,
            "message": e.message,
            "attempts": e.attempts,
        }
        for e in evictions
    ]


# --- the reserved node names -------------------------------------------------------------------


def sync_reserved_names(api: KubeApi, policy: Policy, *, dry_run: bool, out: Output, table: bool) -> dict[str, Any]:
    """Rewrite the backstop's params ConfigMap from the nodes now carrying the reserved label (see
    pool/reserved_names.py); a failure is reported, the nodes stay as written."""
    try:
        synced = reserved_names_sync.sync(api, policy, dry_run=dry_run)
    except ApiError as err:
        if table:
            out.error(
                f"configmap/{reserved_names.PARAMS_CONFIGMAP} -n {reserved_names.NAMESPACE} not written: {err}; "
                "the backstop does not know the reserved node names until it is (audit reports it)"
            )
        return {"result": "failed", "message": str(err)}
    if table:
        out.line(reserved_names_sync.synced_line(synced, dry_run))
    return {"result": synced.result, "nodes": list(synced.names)}


# --- DeviceClasses and DeviceTaintRules --------------------------------------------------------


@dataclass(frozen=True)
class ObjectWritten:
    """What writing one DeviceClass or DeviceTaintRule did."""

    name: str
    # created, replaced, unchanged, recreated, deleted, gone; conflict, foreign, failed, skipped (not done)
    result: str
    message: str = ""
    object: Mapping[str, Any] | None = None  # as the apiserver answered (or as read, when unchanged)

    @property
    def ok(self) -> bool:
        return self.result in ("created", "replaced", "unchanged", "recreated", "deleted", "gone")


def _class_path(name: str | None = None) -> str:
    return api_path(device_classes.API_VERSION, "deviceclasses", name=name)


def _dry_run_query(dry_run: bool) -> dict[str, str] | None:
    return {"dryRun": "All"} if dry_run else None


def _read(api: KubeApi, path: str) -> dict[str, Any] | None:
    try:
        return api.get(path)
    except NotFound:
        return None


def write_owned(
    api: KubeApi,
    collection: str,
    desired: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    *,
    ours: Callable[[Mapping[str, Any]], bool],
    replace_body: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any] | None],
    dry_run: bool,
    not_ours: str = "foreign",
) -> ObjectWritten:
    """Create an object of ``collection``, or replace it with the ``resourceVersion`` read when it says
    something else (``replace_body``: the PUT body, None when it already says ``desired``); on 409
    (changed, or created meanwhile) read it again and retry. Never an object that is not ours."""
    name = str(desired["metadata"]["name"])
    path = f"{collection}/{name}"
    for _ in range(CONFLICT_RETRIES):
        if current is None:
            try:
                created = api.post(collection, desired, dry_run=dry_run)
                return ObjectWritten(name, "created", object=created if isinstance(created, Mapping) else None)
            except Conflict:
                current = _read(api, path)
                continue
        if not ours(current):
            return ObjectWritten(name, not_ours, "created meanwhile by someone else: not ours, not edited")
        body = replace_body(current, desired)
        if body is None:
            return ObjectWritten(name, "unchanged", object=current)
        try:
            replaced = api.request("PUT", path, query=_dry_run_query(dry_run), body=body)
            return ObjectWritten(name, "replaced", object=replaced if isinstance(replaced, Mapping) else None)
        except Conflict:
            current = _read(api, path)
        except NotFound:
            current = None
    return ObjectWritten(name, "conflict", f"it kept changing under us ({CONFLICT_RETRIES} conflicts)")


def write_class(
    api: KubeApi, desired: Mapping[str, Any], current: Mapping[str, Any] | None, *, dry_run: bool
) -> ObjectWritten:
    """One of our DeviceClasses written (``write_owned``)."""
    return write_owned(
        api,
        _class_path(),
        desired,
        current,
        ours=lambda obj: class_info(obj).ours,
        replace_body=replace_body,
        dry_run=dry_run,
    )


def _loses(ours: Mapping[str, Any] | None, others: Iterable[ClassInfo]) -> ClassInfo | None:
    """The class that wins over ``ours`` for the extended resource name, or None when ours wins."""
    if ours is None:
        return None
    info = class_info(ours)
    best = winner([info, *others])
    return best if best is not None and best.name != info.name else None


def recreate_class(
    api: KubeApi,
    desired: Mapping[str, Any],
    current: Mapping[str, Any],
    owner: Ownership,
    *,
    dry_run: bool,
) -> ObjectWritten:
    """Delete our shared class (it is not the one the extended resource maps to, see ``Ownership``) and
    create it again, so that it is the newest class naming the name; on a tie lost by name (same second),
    wait for the next second and do it again."""
    name = str(desired["metadata"]["name"])
    beaten = _loses(current, owner.others)
    why = (
        f"deviceclass/{beaten.name} (created {beaten.created}) was newer"
        if beaten is not None and beaten.created_seconds > class_info(current).created_seconds
        else f"deviceclass/{beaten.name} was created the same second and wins the tie by name"
        if beaten is not None
        else "it was not the newest"
    )
    for _ in range(RECREATE_ATTEMPTS):
        metadata = current.get("metadata") or {}
        preconditions = {"uid": metadata.get("uid"), "resourceVersion": metadata.get("resourceVersion")}
        try:
            api.request(
                "DELETE",
                _class_path(name),
                query=_dry_run_query(dry_run),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions},
            )
        except Conflict:
            return ObjectWritten(name, "conflict", "it changed between the read and the delete: run pool apply again")
        except NotFound:
            pass
        if dry_run:
            return ObjectWritten(
                name,
                "recreated",
                f"{why}; the delete was validated, the class still exists: not re-created in a dry run",
            )
        try:
            created = api.post(_class_path(), desired)
        except ApiError as err:
            return ObjectWritten(
                name,
                "failed",
                f"deleted but not re-created ({err}): {owner.name} maps to no class until pool apply runs again",
            )
        current = created if isinstance(created, Mapping) else dict(desired)
        winner = _loses(current, owner.others)
        if winner is None:
            created_at = class_info(current).created
            return ObjectWritten(
                name,
                "recreated",
                f"{why}; now it is the newest class naming {owner.name} (created {created_at}): the scheduler maps "
                "the name to it",
                current,
            )
        if winner.created_seconds > class_info(current).created_seconds:
            return ObjectWritten(
                name,
                "failed",
                f"re-created, but deviceclass/{winner.name} (created {winner.created}) is newer still: {owner.name} "
                "maps to it",
                current,
            )
        why = f"deviceclass/{winner.name} was created the same second and wins the tie by name"
        time.sleep(CREATION_TICK)
    return ObjectWritten(
        name, "failed", f"still tied with another class naming {owner.name} after {RECREATE_ATTEMPTS} attempts", current
    )


def write_classes(
    api: KubeApi, plan: DevicePlan, *, dry_run: bool, ensure_owner: bool, on_written: Callable[[ObjectWritten], None]
) -> list[ObjectWritten]:
    """The classes in the plan's order: the reserved side's first, the owner of the extended resource name
    last (``device_classes.classes``); one not written skips the rest (the shared class alone would split
    the devices differently from the reserved class)."""
    written: list[ObjectWritten] = []
    for change in plan.classes:
        failed = next((w for w in written if not w.ok), None)
        if failed is not None:
            result = ObjectWritten(change.name, "skipped", f"not written: deviceclass/{failed.name} was not")
        elif change.name == plan.owner.shared_class and plan.owner.name:
            result = _write_shared(api, change, plan.owner, dry_run=dry_run, ensure_owner=ensure_owner)
        else:
            result = write_class(api, change.desired, change.current, dry_run=dry_run)
        on_written(result)
        written.append(result)
    return written


def _write_shared(
    api: KubeApi, change: ClassChange, owner: Ownership, *, dry_run: bool, ensure_owner: bool
) -> ObjectWritten:
    if ensure_owner and change.action == "recreate" and change.current is not None:
        return recreate_class(api, change.desired, change.current, owner, dry_run=dry_run)
    written = write_class(api, change.desired, change.current, dry_run=dry_run)
    # A class created now is the newest, unless another one was created the same second with a lower name.
    created = written.object if written.result == "created" and not dry_run else None
    if ensure_owner and owner.name and created is not None and _loses(created, owner.others) is not None:
        return recreate_class(api, change.desired, created, owner, dry_run=dry_run)
    return written


def write_rule(api: KubeApi, change: RuleChange, version: str, *, dry_run: bool) -> ObjectWritten:
    """One DeviceTaintRule created or replaced (``write_owned``), or deleted, as the plan says."""
    collection = api_path(f"{dra.GROUP}/{version}", device_taint_rules.RESOURCE)
    current, desired = change.current, change.desired
    try:
        if desired is None:
            if current is None:
                return ObjectWritten(change.name, "gone")
            api.request("DELETE", f"{collection}/{change.name}", query=_dry_run_query(dry_run))
            return ObjectWritten(change.name, "deleted")
        return write_owned(
            api,
            collection,
            desired,
            current,
            ours=device_taint_rules.is_ours,
            replace_body=device_taint_rules.replace_body,
            dry_run=dry_run,
            not_ours="failed",
        )
    except NotFound:
        return ObjectWritten(change.name, "gone")
    except ApiError as err:
        return ObjectWritten(change.name, "failed", str(err))


def write_rules(
    api: KubeApi, plan: DevicePlan, *, delete: bool, dry_run: bool, on_written: Callable[[ObjectWritten], None]
) -> list[ObjectWritten]:
    """The rules the plan creates or replaces (``delete`` False: before the classes, so that no device is
    left to training between the two), or deletes (after the classes)."""
    written = []
    for change in plan.rules:
        if change.action == "unchanged" or (change.action == "delete") != delete:
            continue
        result = write_rule(api, change, plan.rule_version or device_taint_rules.VERSIONS[0], dry_run=dry_run)
        on_written(result)
        written.append(result)
    return written


def _rule_line(written: ObjectWritten, dry_run: bool) -> str:
    what = f"devicetaintrule/{written.name}"
    if written.result in ("created", "replaced", "deleted"):
        return f"{what} {written.result}{' (server dry run)' if dry_run else ''}"
    if written.result == "gone":
        return f"{what} already gone"
    return f"{what} not written: {written.message}"


def _class_line(written: ObjectWritten, dry_run: bool) -> str:
    suffix = " (server dry run)" if dry_run else ""
    what = f"deviceclass/{written.name}"
    if written.result in ("created", "replaced"):
        return f"{what} {written.result}{suffix}"
    if written.result == "unchanged":
        return f"{what} unchanged"
    if written.result == "recreated":
        return f"{what} deleted and re-created{suffix}: {written.message}"
    return f"{what} not written: {written.message}"


def written_json(written: ObjectWritten) -> dict[str, Any]:
    return {"name": written.name, "result": written.result, "message": written.message or None}


# --- a device split, written -------------------------------------------------------------------


def write_split_labels(
    api: KubeApi, policy: Policy, plan: DevicePlan, cluster: Cluster, *, dry_run: bool, out: Output, table: bool
) -> list[Written]:
    """Label every split node (apply), or take the label away (release): a merge patch of our label key
    with the ``resourceVersion`` read, 409 → read again, as for whole nodes."""
    by_name = {n.name: n for n in cluster.nodes}
    label = plan.label
    unlabel_verb = f"unlabeled ({label[0]}={label[1]} removed)"
    label_verb = f"labeled {label[0]}={label[1]}"

    def unsplit(node: PoolNode) -> dict[str, Any] | None:
        return unsplit_label_patch(node, label)

    def split_it(node: PoolNode) -> dict[str, Any] | None:
        return split_label_patch(node, label)

    written = []
    for split in plan.nodes:
        node = by_name.get(split.node)
        if node is None:
            continue
        # A node of the split gets the label; the others (a release, or a node no longer chosen) lose it.
        in_split = split.label in ("add", "replace", "keep")
        make, verb = (split_it, label_verb) if in_split else (unsplit, unlabel_verb)
        result = write_node(api, node, make, policy, dry_run=dry_run)
        written.append(result)
        if table:
            out.line(written_line(result, verb, dry_run))
    return written


def write_split(
    api: KubeApi,
    policy: Policy,
    cluster: Cluster,
    plan: DevicePlan,
    out: Output,
    *,
    dry_run: bool,
    table: bool,
    ensure_owner: bool,
) -> tuple[list[ObjectWritten], list[Written], list[ObjectWritten], bool]:
    """The plan printed (table), the DeviceTaintRules that taint more devices, the classes, the rules that
    taint fewer (each step only once the one before went through: training is never given a reserved
    device in between), then the split nodes' label: what apply and release share. Also whether
    everything went through."""
    if table:
        for line in plan_lines(plan, policy):
            out.line(line)
        out.line()

    def on_rule(w: ObjectWritten) -> None:
        if table:
            out.line(_rule_line(w, dry_run))

    rules = write_rules(api, plan, delete=False, dry_run=dry_run, on_written=on_rule)
    written: list[ObjectWritten] = []
    labelled: list[Written] = []
    if all(r.ok for r in rules):
        written = write_classes(
            api,
            plan,
            dry_run=dry_run,
            ensure_owner=ensure_owner,
            on_written=(lambda w: out.line(_class_line(w, dry_run))) if table else (lambda w: None),
        )
        if all(w.ok for w in written):
            rules += write_rules(api, plan, delete=True, dry_run=dry_run, on_written=on_rule)
    elif table:
        out.line("The DeviceClasses were not written: a DeviceTaintRule was not.")
    if written and all(w.ok for w in written) and all(r.ok for r in rules):
        labelled = write_split_labels(api, policy, plan, cluster, dry_run=dry_run, out=out, table=table)
    ok = (
        bool(written)
        and all(w.ok for w in written)
        and all(r.ok for r in rules)
        and all(w.result in ("patched", "unchanged", "gone") for w in labelled)
    )
    return written, labelled, rules, ok
