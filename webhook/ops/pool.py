"""``rocm-isolation-webhook pool plan|apply|release|status``: label and taint the reserved nodes.

An operator's tool, run with a person's kubeconfig: it patches nodes and evicts pods, which the
webhook's service account may not do (its ClusterRole only reads). It never falls back to an
in-cluster service account.

- ``plan`` (the default) reads the cluster and prints what ``apply`` would do; it changes nothing.
- ``apply`` patches each chosen node (our label and taint only, see ``reservation.py``), re-reading
  a node and retrying when a concurrent edit makes the apiserver answer 409, and with ``--evict``
  evicts the non-inference pods the NoSchedule taint leaves in place (``eviction.py``).
- ``release`` removes our label and taint, after checking that the inference pods on those nodes
  still have room on the reserved nodes left (or ``--force``).
- ``status`` shows the pool as it is: label/taint consistency, GPUs, pods by class.

Device-level reservation (``--devices-per-node N``; nodes whose GPUs AMD's DRA driver publishes): the N
GPUs with the lowest PCI bus IDs of every node of the driver go to inference, through two DeviceClasses
(``webhook.deploy.device_classes``; the planning is ``device_reservation.py``). ``apply`` writes the
reserved class, then the shared one (created, or replaced with the ``resourceVersion`` read: 409 → read
again and retry), keeps the shared class the one the scheduler maps ``amd.com/gpu`` to, labels the split
nodes with ``reservedDevices.nodeLabelValue`` (inference is placed on them), and with ``--evict`` evicts
the pods of other classes holding devices that became reserved; ``release --devices --all`` widens both
classes to every device (never deletes them) and removes the label; ``status`` adds a device section.

Exit status: 0 done (or nothing to do), 1 something was refused or not done (an eviction still
refused at ``--timeout``, a release refused, a node that kept changing under us), 2 the cluster
cannot be read or the input is wrong (unknown node, selector matching nothing, ...): nothing is
changed then.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.cluster.inventory import NodeInfo, Snapshot, node_info, pod_info
from webhook.cluster.kubeapi import ApiError, Conflict, Forbidden, KubeApi, NotFound, api_path
from webhook.cluster.slices import Gpu as Slot
from webhook.core import claims as dra
from webhook.core import engine
from webhook.core.policy import Policy, PolicyError, default_policy, load_policy
from webhook.deploy import device_classes, device_taint_rules, reserved_names
from webhook.ops import device_reservation, reserved_names_sync
from webhook.ops.device_reservation import (
    RESERVED,
    SHARED,
    ClassChange,
    ClassInfo,
    Device,
    DevicePlan,
    DeviceStatus,
    PublishedDevices,
    SplitCapacity,
    SubsetError,
)
from webhook.ops.eviction import EvictionResult, evict_pods, eviction_body
from webhook.ops.reservation import (
    Capacity,
    Plan,
    PoolNode,
    PoolPod,
    Reservation,
    SelectionError,
    build_plan,
    choose_nodes,
    columns,
    parse_names,
    parse_selector,
    plan_json,
    plan_lines,
    plural,
    release_patch,
    reserve_patch,
    room_after_release,
    taint_text,
)

EXIT_OK = 0
EXIT_NOT_DONE = 1
EXIT_BAD = 2

ACTIONS = ("plan", "apply", "release", "status")
CONFLICT_RETRIES = 5
# creationTimestamp has a resolution of one second: a new shared class that ties with another class naming
# its extended resource, and loses the tie by name, is re-created once the second has passed.
CREATION_TICK = 1.0
RECREATE_ATTEMPTS = 3
EVICTION_BACKOFF = (1.0, 16.0)  # seconds: the first wait after a refusal, and the longest
MIRROR_ANNOTATION = engine.MIRROR_ANNOTATION
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")

EPILOG = """\
examples:
  rocm-isolation-webhook pool --selector amd.com/gpu.device-id=74a1 --count 2
  rocm-isolation-webhook pool apply --selector amd.com/gpu.device-id=74a1 --count 2 --evict --timeout 10m
  rocm-isolation-webhook pool apply --nodes gpu-1,gpu-2 --dry-run=server
  rocm-isolation-webhook pool release --nodes gpu-2
  rocm-isolation-webhook pool status -o json
  rocm-isolation-webhook pool plan --devices-per-node 2
  rocm-isolation-webhook pool apply --devices-per-node 2 --evict
  rocm-isolation-webhook pool release --devices --all
"""


class UsageError(Exception):
    """Options that do not go together: exit 2 before anything is read."""


def duration(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``5m`` or ``1h`` (kubectl's ``--timeout`` spellings)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 300s, 5m, 1h)")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        default="plan",
        help="plan (default: print what apply would do), apply, release, status",
    )
    which = parser.add_argument_group("which nodes (plan, apply; release takes --nodes or --all)")
    which.add_argument("--nodes", metavar="NAME[,NAME...]", help="these nodes")
    which.add_argument("--selector", "-l", metavar="KEY=VALUE[,...]", help="choose among the nodes with these labels")
    which.add_argument("--count", type=int, metavar="N", help="choose N nodes (with --selector or among all GPU nodes)")
    which.add_argument("--gpus", type=int, metavar="N", help="choose enough nodes to hold N allocatable GPUs")
    which.add_argument("--all", action="store_true", help="release: every node of the pool")
    devices = parser.add_argument_group("device-level reservation (nodes whose GPUs AMD's DRA driver publishes)")
    devices.add_argument(
        "--devices-per-node",
        type=int,
        metavar="N",
        help="plan, apply: reserve the N GPUs with the lowest PCI bus IDs of every node of the driver",
    )
    devices.add_argument(
        "--devices",
        action="store_true",
        help="release --all (or --nodes, with DeviceTaintRules): release the device reservation (not whole nodes)",
    )
    devices.add_argument(
        "--device-taint-rules",
        action="store_true",
        help="use resource.k8s.io/v1beta2 DeviceTaintRules (Kubernetes 1.36: the DRADeviceTaintRules feature gate "
        "must be on in kube-apiserver, kube-scheduler and kube-controller-manager, which the API cannot show); "
        "v1 (1.37) needs no flag",
    )
    parser.add_argument("--evict", action="store_true", help="apply: evict the non-inference pods left on the nodes")
    parser.add_argument(
        "--timeout",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="apply --evict: how long to retry evictions a PodDisruptionBudget refuses (default 5m)",
    )
    parser.add_argument(
        "--dry-run",
        choices=("none", "server"),
        default="none",
        help="apply, release: server sends every write with dryRun=All (validated, not persisted)",
    )
    parser.add_argument("--force", action="store_true", help="release: even if inference pods would lose their room")
    parser.add_argument("--policy", metavar="FILE", help="IsolationPolicy YAML (default: the built-in policy)")
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="an operator's kubeconfig (default: $KUBECONFIG or ~/.kube/config; never the in-cluster account)",
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    parser.add_argument(
        "-n",
        "--namespace",
        help="ignored, as kubectl ignores it for cluster-scoped objects: nodes have no namespace (evictions follow "
        "the pods on the nodes, whatever their namespace)",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def check_usage(args: argparse.Namespace) -> None:
    action = args.action
    choosing = [name for name in ("nodes", "selector", "count", "gpus") if getattr(args, name) is not None]
    only = {
        "evict": ("apply",),
        "force": ("release",),
        "all": ("release",),
        "devices": ("release",),
        "device_taint_rules": ("plan", "apply", "release"),
    }
    for option, actions in only.items():
        if getattr(args, option, False) and action not in actions:
            raise UsageError(f"--{option.replace('_', '-')} is only for pool {' / '.join(actions)}")
    if args.dry_run != "none" and action not in ("apply", "release"):
        raise UsageError("--dry-run is only for pool apply / release")
    per_node = getattr(args, "devices_per_node", None)
    if per_node is not None:
        if action not in ("plan", "apply"):
            raise UsageError("--devices-per-node is only for pool plan / apply")
        if per_node < 1:
            raise UsageError(f"--devices-per-node {per_node}: give at least 1")
        extra = [name for name in ("count", "gpus") if getattr(args, name) is not None]
        if extra:
            raise UsageError(f"--devices-per-node splits every node of the driver: it does not go with --{extra[0]}")
        if args.nodes is not None and args.selector is not None:
            raise UsageError("--nodes names the nodes: it does not go with --selector")
        return
    if action == "release" and getattr(args, "devices", False):
        if args.force:
            raise UsageError("--force is for releasing whole nodes: a device release leaves every pod its devices")
        extra = [name for name in choosing if name != "nodes"]
        if extra or (args.nodes is None) == (not args.all):
            raise UsageError("pool release --devices needs --all, or --nodes NAME[,NAME...]")
        return
    if action == "status":
        if choosing:
            raise UsageError(f"pool status shows the whole pool: --{choosing[0]} does not apply")
        return
    if action == "release":
        extra = [name for name in choosing if name != "nodes"]
        if extra:
            raise UsageError(f"pool release takes --nodes or --all, not --{extra[0]}")
        if (args.nodes is None) == (not args.all):
            raise UsageError("pool release needs --nodes NAME[,NAME...] or --all")
        return
    if args.nodes is not None and len(choosing) > 1:
        raise UsageError("--nodes names the nodes: it does not go with --selector, --count or --gpus")
    if args.count is not None and args.gpus is not None:
        raise UsageError("give --count or --gpus, not both")
    if not choosing:
        raise UsageError("say which nodes: --nodes NAME[,...], or --selector KEY=VALUE with --count N or --gpus N")


def kubeconfig_path(given: str | None) -> str:
    """The operator's kubeconfig; never the in-cluster service account."""
    if given:
        return given
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = default.split(os.pathsep)[0]
    if first and Path(first).is_file():
        return first
    raise UsageError(
        "pool needs an operator's kubeconfig (--kubeconfig FILE or $KUBECONFIG): it patches nodes and evicts "
        "pods, which the webhook's own service account may not do"
    )


def main(args: argparse.Namespace) -> int:
    out = Output(sys.stdout, sys.stderr)
    try:
        check_usage(args)
        policy = load_policy(args.policy) if args.policy else default_policy()
        api = KubeApi.connect(kubeconfig_path(args.kubeconfig), context=args.context)
    except (UsageError, PolicyError) as err:
        out.error(str(err))
        return EXIT_BAD
    except ApiError as err:
        out.error(str(err))
        return EXIT_BAD
    try:
        return run(args, api, policy, out)
    except (SelectionError, UsageError) as err:
        out.error(f"{err}; nothing was changed")
        return EXIT_BAD
    except ApiError as err:
        out.error(str(err))
        return EXIT_BAD
    finally:
        api.close()


@dataclass
class Output:
    stdout: Any
    stderr: Any

    def line(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", file=self.stderr, flush=True)

    def warning(self, text: str) -> None:
        print(f"warning: {text}", file=self.stderr, flush=True)

    def json(self, document: Any) -> None:
        self.stdout.write(json.dumps(document, indent=2) + "\n")


# --- reading the cluster -------------------------------------------------------------------------


def pool_node(info: NodeInfo) -> PoolNode:
    return PoolNode(
        info.name, info.labels, info.taints, info.resource_version, info.gpus, info.unschedulable, info.unhealthy
    )


@dataclass(frozen=True)
class Cluster:
    nodes: list[PoolNode]
    pods: list[PoolPod]
    uids: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) of a pod -> its uid
    plugin_gpus: dict[str, int] = field(default_factory=dict)  # node -> allocatable amd.com/ GPU resources


def classify(raw: Mapping[str, Any], snapshot: Snapshot, policy: Policy) -> str:
    """The pod's class as admission decides it (the engine itself), "" when the policy skips it."""
    namespace = str((raw.get("metadata") or {}).get("namespace", ""))
    decision = engine.decide(
        operation="CREATE",
        pod=raw,
        namespace=snapshot.namespace_facts(namespace),
        nodes=snapshot.node_facts(),
        policy=policy,
        claims=snapshot.claim_facts(namespace),
        devices=snapshot.devices,
    )
    return decision.workload_class or ""


def pool_pod(
    raw: Mapping[str, Any], snapshot: Snapshot, policy: Policy, counted: set[Slot] | None = None
) -> PoolPod | None:
    """A bound, unfinished pod that holds GPUs (its resources, and the DRA GPU slots of its claims not in
    ``counted`` yet) or that the policy classifies; None otherwise."""
    info = pod_info(raw, policy)
    if not info.bound:
        return None
    gpus = info.gpus + snapshot.dra_gpus_held(raw, set() if counted is None else counted)
    class_name = classify(raw, snapshot, policy)
    if not class_name and gpus == 0:
        return None
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    cls = policy.spec.classes.get(class_name)
    return PoolPod(
        namespace=info.namespace,
        name=info.name,
        node=info.node,
        owner=f"{info.owner[0]}/{info.owner[1]}" if info.owner else "",
        gpus=gpus,
        class_name=class_name,
        inference=cls is not None and cls.placement == "reserved",
        daemonset=info.owner is not None and info.owner[0] == "DaemonSet",
        mirror=MIRROR_ANNOTATION in annotations,
    )


def read_cluster(api: KubeApi, policy: Policy) -> Cluster:
    snapshot = Snapshot.read(api, policy)
    pods: list[PoolPod] = []
    uids: dict[tuple[str, str], str] = {}
    counted: set[Slot] = set()

    def restart() -> None:
        pods.clear()
        uids.clear()
        counted.clear()

    for raw in Snapshot.pods(api, on_restart=restart):
        found = pool_pod(raw, snapshot, policy, counted)
        if found is not None:
            pods.append(found)
            uids[(found.namespace, found.name)] = str((raw.get("metadata") or {}).get("uid", ""))
    plugin = {
        info.name: sum(
            n for name, n in info.gpu_resources.items() if name.startswith(device_reservation.DEVICE_PLUGIN_PREFIX)
        )
        for info in snapshot.nodes.values()
    }
    return Cluster([pool_node(info) for info in snapshot.nodes.values()], pods, uids, plugin)


def read_node(api: KubeApi, name: str, policy: Policy) -> PoolNode:
    return pool_node(node_info(api.get(api_path("v1", "nodes", name=name)), policy))


# --- the actions -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, api: KubeApi, policy: Policy, out: Output) -> int:
    reservation = Reservation.from_policy(policy)
    cluster = read_cluster(api, policy)
    if args.action == "status":
        state = read_dra(api, policy, claims=True, required=False)
        for warning in state.warnings:
            out.warning(warning)
        split_value = policy.spec.reserved_devices.node_label_value
        return status(cluster, reservation, args, out, device_status(policy, cluster, state), split_value)
    if args.action == "release" and getattr(args, "devices", False):
        return release_devices(api, policy, cluster, args, out)
    if args.action == "release":
        return release(api, policy, cluster, reservation, args, out)
    if getattr(args, "devices_per_node", None) is not None:
        devices = device_plan(api, policy, cluster, reservation, args)
        if args.action == "plan":
            if args.output == "json":
                out.json({"devices": device_reservation.plan_json(devices)})
            else:
                for line in device_reservation.plan_lines(devices, policy):
                    out.line(line)
            return EXIT_OK
        return apply_devices(api, policy, cluster, devices, args, out)
    selection = choose_nodes(
        cluster.nodes,
        cluster.pods,
        reservation,
        names=parse_names(args.nodes) if args.nodes is not None else None,
        selector=parse_selector(args.selector) if args.selector is not None else None,
        count=args.count,
        gpus=args.gpus,
    )
    refuse_split_nodes(api, policy, [c.node.name for c in selection.chosen], out)
    plan = build_plan(selection, cluster.nodes, cluster.pods, reservation)
    if args.action == "plan":
        if args.output == "json":
            out.json(plan_json(plan))
        else:
            for line in plan_lines(plan):
                out.line(line)
        return EXIT_OK
    return apply(api, policy, plan, args, out)


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


def _written_line(written: Written, verb: str, dry_run: bool) -> str:
    suffix = " (server dry run)" if dry_run else ""
    if written.result == "patched":
        return f"node/{written.node} {verb}{suffix}"
    if written.result == "unchanged":
        return f"node/{written.node} unchanged"
    if written.result == "gone":
        return f"node/{written.node} not found: deleted meanwhile"
    return f"node/{written.node} not changed: it kept changing under us ({written.attempts} conflicts)"


def _reserve_verb(patch: Mapping[str, Any]) -> str:
    labelled = "labels" in patch.get("metadata", {})
    tainted = "spec" in patch
    return "labeled and tainted" if labelled and tainted else "labeled" if labelled else "tainted"


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


def _eviction_line(result: EvictionResult) -> str:
    pod = f"pod/{result.pod.name} -n {result.pod.namespace}"
    if result.outcome == "refused":
        return f"{pod} not evicted: {result.message} (still refused after {result.attempts} attempts)"
    if result.outcome == "failed":
        return f"{pod} not evicted: {result.message}"
    if result.outcome == "skipped":
        return f"{pod} skipped: {result.message}"
    return f"{pod} {result.message}"


def sync_reserved_names(api: KubeApi, policy: Policy, *, dry_run: bool, out: Output, table: bool) -> dict[str, Any]:
    """Rewrite the backstop's params ConfigMap from the nodes now carrying the reserved label (see
    reserved_names_sync.py); a failure is reported, the nodes stay as written."""
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


def apply(api: KubeApi, policy: Policy, plan: Plan, args: argparse.Namespace, out: Output) -> int:
    dry_run = args.dry_run == "server"
    table = args.output == "table"
    if table:
        for line in plan_lines(plan):
            out.line(line)
        out.line()
    written: list[Written] = []
    for node_plan in plan.nodes:
        result = write_node(api, node_plan.node, lambda n: reserve_patch(n, plan.reservation), policy, dry_run=dry_run)
        written.append(result)
        if table:
            out.line(_written_line(result, _reserve_verb(result.patch or {}), dry_run))
    names = sync_reserved_names(api, policy, dry_run=dry_run, out=out, table=table)
    evictions: list[EvictionResult] = []
    if args.evict:
        staying = [p for n in plan.nodes for p in n.staying]
        evictions = evict_pods(
            staying,
            evictor(api, dry_run=dry_run),
            timeout=args.timeout,
            backoff_initial=EVICTION_BACKOFF[0],
            backoff_max=EVICTION_BACKOFF[1],
            on_result=(lambda r: out.line(_eviction_line(r))) if table else None,
        )
    elif table and any(n.staying for n in plan.nodes):
        out.line("The pods listed above keep running: pool apply --evict evicts them.")
    ok = (
        all(w.result in ("patched", "unchanged") for w in written)
        and all(e.done for e in evictions)
        and names["result"] != "failed"
    )
    if table and not any(w.result == "patched" for w in written) and ok and not evictions:
        out.line("Nothing changed: the pool was already set up.")
    if not table:
        out.json(
            {
                "plan": plan_json(plan),
                "dryRun": dry_run,
                "nodes": [{"name": w.node, "result": w.result, "patch": w.patch} for w in written],
                "reservedNodeNames": names,
                "evictions": [
                    {
                        "namespace": e.pod.namespace,
                        "name": e.pod.name,
                        "outcome": e.outcome,
                        "message": e.message,
                        "attempts": e.attempts,
                    }
                    for e in evictions
                ],
            }
        )
    return EXIT_OK if ok else EXIT_NOT_DONE


def release(
    api: KubeApi,
    policy: Policy,
    cluster: Cluster,
    reservation: Reservation,
    args: argparse.Namespace,
    out: Output,
) -> int:
    dry_run = args.dry_run == "server"
    by_name = {n.name: n for n in cluster.nodes}

    split_value = policy.spec.reserved_devices.node_label_value
    if args.all:
        # Split nodes carry our label key too: the device reservation's, released with --devices.
        names = sorted(
            n.name
            for n in cluster.nodes
            if n.marked(reservation) and not device_reservation.split_labelled(n, reservation, split_value)
        )
    else:
        names = parse_names(args.nodes)
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise SelectionError(f"node{'s' if len(unknown) > 1 else ''} not found: {', '.join(unknown)}")
        split = [name for name in names if device_reservation.split_labelled(by_name[name], reservation, split_value)]
        if split:
            raise SelectionError(
                f"{', '.join(split)} {'is' if len(split) == 1 else 'are'} split (label {reservation.label[0]}="
                f"{split_value}), not reserved whole: pool release --devices --all releases the device reservation"
            )
    homeless = room_after_release(names, cluster.nodes, cluster.pods, reservation)
    table = args.output == "table"
    if homeless and not args.force:
        if table:
            out.error(
                "release refused: these inference pods would have no room left on the reserved nodes "
                "(allocatable minus requested GPUs); grow the pool first or pass --force"
            )
            rows = [["NAMESPACE", "POD", "NODE", "GPUS"]]
            rows += [[p.namespace, p.name, p.node, str(p.gpus)] for p in homeless]
            for line in columns(rows):
                print(line, file=out.stderr)
        else:
            out.json({"released": False, "homeless": [_pod_ref(p) for p in homeless], "nodes": []})
        return EXIT_NOT_DONE
    written = [
        write_node(api, by_name[name], lambda n: release_patch(n, reservation), policy, dry_run=dry_run)
        for name in names
    ]
    if table:
        if not names:
            out.line("The pool has no nodes: nothing to release.")
        for w in written:
            out.line(_written_line(w, "released (label and taint removed)", dry_run))
        if homeless:
            out.line(f"warning: --force: {len(homeless)} inference pod(s) have no room left in the pool")
    reserved_node_names = sync_reserved_names(api, policy, dry_run=dry_run, out=out, table=table)
    if not table:
        out.json(
            {
                "released": True,
                "dryRun": dry_run,
                "homeless": [_pod_ref(p) for p in homeless],
                "nodes": [{"name": w.node, "result": w.result, "patch": w.patch} for w in written],
                "reservedNodeNames": reserved_node_names,
            }
        )
    done = all(w.result in ("patched", "unchanged") for w in written) and reserved_node_names["result"] != "failed"
    return EXIT_OK if done else EXIT_NOT_DONE


def _pod_ref(pod: PoolPod) -> dict[str, Any]:
    return {"namespace": pod.namespace, "name": pod.name, "node": pod.node, "gpus": pod.gpus}


# --- status ------------------------------------------------------------------------------------------


def node_state(node: PoolNode, reservation: Reservation) -> str:
    labelled, tainted = node.labelled(reservation), node.tainted(reservation)
    other = [t for t in node.taints if reservation.has_our_key(t) and not reservation.is_our_taint(t)]
    if other:
        return f"taint {taint_text(other[0])} is not the policy's: pool apply --nodes {node.name} replaces it"
    key, _ = reservation.label
    if not labelled and key in node.labels:
        return f"label {key}={node.labels[key]} is not the policy's: pool apply or release --nodes {node.name}"
    if reservation.taint is None:
        return "ok" if labelled else "not reserved"
    if labelled and tainted:
        return "no allocatable GPUs" if node.gpus == 0 else "ok"
    if labelled:
        return (
            f"label without taint: pods without the webhook's placement can land here (pool apply --nodes {node.name})"
        )
    return f"taint without label: inference placement cannot select it (pool apply or release --nodes {node.name})"


def _split_capacity(
    cluster: Cluster,
    reservation: Reservation,
    whole: set[str],
    devices: DeviceStatus | None,
    split_value: str | None,
) -> SplitCapacity:
    """The split nodes of an active device reservation (publishing the driver's devices, or labelled split;
    never a node reserved whole) and their share of each pool, as the audit counts them."""
    if devices is None or devices.reservation is None or not devices.reservation.active:
        return SplitCapacity(frozenset(), {RESERVED: 0, SHARED: 0}, {RESERVED: (), SHARED: ()})
    labelled = {
        n.name
        for n in cluster.nodes
        if split_value is not None and device_reservation.split_labelled(n, reservation, split_value)
    }
    chosen = device_reservation.split_nodes(devices.published, devices.reservation) | labelled
    return device_reservation.split_capacity(devices, chosen - whole)


def _by_class(pods: Iterable[PoolPod]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        entry = out.setdefault(pod.class_name or "(out of scope)", {"pods": 0, "gpus": 0})
        entry["pods"] += 1
        entry["gpus"] += pod.gpus
    return dict(sorted(out.items()))


def status(
    cluster: Cluster,
    reservation: Reservation,
    args: argparse.Namespace,
    out: Output,
    devices: DeviceStatus | None = None,
    split_value: str | None = None,
) -> int:
    # Split nodes (the device reservation's label value) are shown in the device section.
    members = sorted(
        (
            n
            for n in cluster.nodes
            if n.marked(reservation)
            and (split_value is None or not device_reservation.split_labelled(n, reservation, split_value))
        ),
        key=lambda n: n.name,
    )
    names = {n.name for n in members if n.labelled(reservation)}
    requested: dict[str, int] = {}
    for pod in cluster.pods:
        requested[pod.node] = requested.get(pod.node, 0) + pod.gpus
    split = _split_capacity(cluster, reservation, names, devices, split_value)
    on_reserved = [p for p in cluster.pods if p.node in names]
    pooled = names | split.nodes
    shared_nodes = [n for n in cluster.nodes if n.name not in pooled and n.gpus > 0]
    shared_names = {n.name for n in shared_nodes}
    # A split node's pods that hold none of the driver's GPUs count in the shared pool with their own.
    held = {(p.namespace, p.name) for pods in split.pods.values() for p in pods}
    on_shared = [
        p
        for p in cluster.pods
        if p.node in shared_names or (p.node in split.nodes and (p.namespace, p.name) not in held)
    ]
    strays = sorted((p for p in on_reserved if not p.inference), key=lambda p: (p.node, p.namespace, p.name))
    on_reserved += split.pods[RESERVED]
    on_shared += split.pods[SHARED]
    reserved_cap = Capacity(
        len(names) + len(split.nodes),
        sum(n.gpus for n in members if n.name in names) + split.gpus[RESERVED],
        sum(p.gpus for p in on_reserved),
    )
    shared_cap = Capacity(
        len(shared_nodes) + len(split.nodes),
        sum(n.gpus for n in shared_nodes) + split.gpus[SHARED],
        sum(p.gpus for p in on_shared),
    )
    if args.output == "json":
        out.json(
            {
                "reservation": {
                    "label": {"key": reservation.label[0], "value": reservation.label[1]},
                    "taint": reservation.taint,
                },
                "nodes": [
                    {
                        "name": n.name,
                        "labelled": n.labelled(reservation),
                        "tainted": n.tainted(reservation),
                        "gpusAllocatable": n.gpus,
                        "gpusRequested": requested.get(n.name, 0),
                        "state": node_state(n, reservation),
                    }
                    for n in members
                ],
                "reserved": {**reserved_cap.as_json(), "podsByClass": _by_class(on_reserved)},
                "shared": {**shared_cap.as_json(), "podsByClass": _by_class(on_shared)},
                "nonInferenceOnReserved": [{**_pod_ref(p), "class": p.class_name} for p in strays],
                "devices": device_reservation.status_json(devices) if devices is not None else None,
            }
        )
        return EXIT_OK
    out.line(f"Reserved pool: label {reservation.label_text}, taint {reservation.taint_text}")
    out.line()
    if members:
        rows = [["NODE", "LABEL", "TAINT", "GPUS", "REQUESTED", "STATE"]]
        rows += [
            [
                n.name,
                "yes" if n.labelled(reservation) else "no",
                "yes" if n.tainted(reservation) else "no",
                str(n.gpus),
                str(requested.get(n.name, 0)),
                node_state(n, reservation),
            ]
            for n in members
        ]
        for line in columns(rows):
            out.line(line)
    else:
        out.line("No node carries the reserved label or taint (pool plan shows how to set the pool up).")
    for title, cap, pods in (("Reserved", reserved_cap, on_reserved), ("Shared", shared_cap, on_shared)):
        classes = ", ".join(
            f"{name} {plural(v['pods'], 'pod')} / {plural(v['gpus'], 'GPU')}" for name, v in _by_class(pods).items()
        )
        out.line()
        out.line(
            f"{title}: {plural(cap.nodes, 'node')}, {plural(cap.gpus_allocatable, 'GPU')} allocatable, "
            f"{cap.gpus_requested} requested" + (f" ({classes})" if classes else "")
        )
    if strays:
        out.line()
        out.line("Non-inference pods on reserved nodes (pool apply --nodes NODE --evict moves them):")
        rows = [["NODE", "NAMESPACE", "POD", "CLASS", "GPUS"]]
        rows += [[p.node, p.namespace, p.name, p.class_name or "-", str(p.gpus)] for p in strays]
        for line in columns(rows):
            out.line(line)
    if devices is not None:
        out.line()
        for line in device_reservation.status_lines(devices):
            out.line(line)
    return EXIT_OK


# --- device-level reservation --------------------------------------------------------------------------


@dataclass
class DraState:
    """What device-level reservation reads of Dynamic Resource Allocation, raw."""

    version: str | None  # the resource.k8s.io version read; None when none is served (or not readable)
    classes: dict[str, ClassInfo]
    published: dict[str, tuple[Device, ...]]  # the driver's devices per node
    claims: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    # Our DeviceTaintRules, and any rule of one of our names (refused by the plan, never written over).
    rules: list[dict[str, Any]] = field(default_factory=list)
    # The resource.k8s.io versions serving devicetaintrules, newest first; None when discovery failed.
    rule_versions: tuple[str, ...] | None = ()
    server_version: tuple[int, int, int] | None = None  # the kube-apiserver's (GET /version)

    @property
    def rule_version(self) -> str | None:
        return self.rule_versions[0] if self.rule_versions else None


def read_dra(api: KubeApi, policy: Policy, *, claims: bool, required: bool) -> DraState:
    """DeviceClasses, the driver's devices in ResourceSlices and (``claims``) ResourceClaims, from the newest
    resource.k8s.io version served. ``required``: an error (RBAC) is raised (exit 2), else it is a warning
    and nothing is known (whole-node commands and status keep working without DRA permissions)."""
    driver = policy.spec.reserved_devices.driver
    for version in dra.VERSIONS:
        group_version = f"{dra.GROUP}/{version}"
        found: list[dict[str, Any]] = []
        try:
            for obj in api.list(api_path(group_version, "deviceclasses"), on_restart=found.clear):
                found.append(obj)
        except NotFound:
            continue
        try:
            published = PublishedDevices(driver)
            for resource_slice in api.list(api_path(group_version, "resourceslices"), on_restart=published.clear):
                published.add(resource_slice)
            raw_claims: list[dict[str, Any]] = []
            if claims:
                for claim in api.list(api_path(group_version, "resourceclaims"), on_restart=raw_claims.clear):
                    raw_claims.append(claim)
        except (NotFound, Forbidden) as err:
            if required:
                raise
            return DraState(None, {}, {}, [], [f"device-level reservation not read ({err})"])
        state = DraState(version, device_reservation.class_infos(found), published.per_node(), raw_claims)
        read_taint_rules(api, state, required=required)
        return state
    return DraState(None, {}, {}, [])


def read_taint_rules(api: KubeApi, state: DraState, *, required: bool) -> None:
    """Our DeviceTaintRules, in the newest version that serves them (none when none does)."""
    state.rule_versions = device_taint_rule_versions(api)
    state.server_version = server_version(api)
    version = state.rule_version
    if version is None:
        return
    path = api_path(f"{dra.GROUP}/{version}", device_taint_rules.RESOURCE)
    found: list[dict[str, Any]] = []
    try:
        for obj in api.list(path, on_restart=found.clear):
            # Ours, and any other of our rules' names: a rule of that name that is not ours is refused by
            # the plan (rule_changes), never written over.
            name = str(_mapping(obj.get("metadata")).get("name", ""))
            if device_taint_rules.is_ours(obj) or name.startswith(device_taint_rules.NAME_PREFIX):
                found.append(obj)
    except (NotFound, Forbidden) as err:
        if required:
            raise
        state.warnings.append(f"DeviceTaintRules not read ({err})")
        return
    state.rules[:] = found


def server_version(api: KubeApi) -> tuple[int, int, int] | None:
    """The kube-apiserver's version (``gitVersion`` v1.36.2, or its ``major``/``minor`` when that does not
    parse), None when it cannot be read."""
    try:
        document = api.get("/version")
    except ApiError:
        return None
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(document.get("gitVersion") or ""))
    if found:
        major, minor, patch = (int(part) for part in found.groups())
        return (major, minor, patch)
    return None


def device_taint_rule_versions(api: KubeApi) -> tuple[str, ...] | None:
    """The resource.k8s.io versions whose API discovery lists ``devicetaintrules``, newest first; None when
    discovery could not be read."""
    try:
        return api.serving_versions(device_taint_rules.GROUP, device_taint_rules.VERSIONS, device_taint_rules.RESOURCE)
    except ApiError:
        return None


def require_v1(state: DraState) -> None:
    if state.version != "v1":
        served = f"resource.k8s.io/{state.version}" if state.version else "no resource.k8s.io version"
        raise SelectionError(
            f"device-level reservation writes resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 or later; "
            f"extendedResourceName needs 1.36): this cluster serves {served}"
        )


def refuse_split_nodes(api: KubeApi, policy: Policy, names: Iterable[str], out: Output) -> None:
    """A node is reserved whole or split, never both: whole-node ``plan``/``apply`` refuse a node whose
    devices the active device reservation splits."""
    state = read_dra(api, policy, claims=False, required=False)
    for warning in state.warnings:
        out.warning(f"{warning}: cannot check that no chosen node's devices are split")
    current = device_reservation.current_reservation(policy, state.classes)
    if current is None or not current.active:
        return
    current = device_classes.with_tainted(current, device_taint_rules.tainted_keys(state.rules))
    split_now = device_reservation.split_nodes(state.published, current)
    split_nodes = sorted(name for name in names if name in split_now)
    if split_nodes:
        devices = policy.spec.reserved_devices
        raise SelectionError(
            f"{', '.join(split_nodes)} publish{'es' if len(split_nodes) == 1 else ''} {devices.driver} devices, "
            f"which the active device reservation splits (deviceclass/{devices.reserved_class_name}: "
            f"{device_reservation.reservation_text(current)}): a node is reserved whole or split, never both. "
            "Release the device reservation first (pool release --devices --all"
            + (f", or --nodes {','.join(split_nodes)}" if current.by_taints else "")
            + "), or choose nodes without the DRA driver"
        )


def device_status(policy: Policy, cluster: Cluster, state: DraState) -> DeviceStatus | None:
    """The device section of ``status``: when nodes publish the driver's devices, or our classes exist."""
    devices = policy.spec.reserved_devices
    ours = [n for n in (devices.reserved_class_name, devices.shared_class_name) if n in state.classes]
    if not state.published and not ours:
        return None
    held, _ = device_reservation.holds(state.claims, devices.driver, state.published, cluster.pods, cluster.uids)
    return device_reservation.device_status(
        policy, state.published, state.classes, held, {n.name: n for n in cluster.nodes}, state.rules
    )


def taint_rules_why_not(state: DraState, args: argparse.Namespace) -> str | None:
    """Why DeviceTaintRules may not hold the split here (``device_reservation.taint_rules_unusable``)."""
    return device_reservation.taint_rules_unusable(
        state.rule_versions, state.server_version, opted_in=bool(getattr(args, "device_taint_rules", False))
    )


def device_plan(
    api: KubeApi,
    policy: Policy,
    cluster: Cluster,
    reservation: Reservation,
    args: argparse.Namespace,
    *,
    state: DraState | None = None,
    chosen: Sequence[str] | None = None,
) -> DevicePlan:
    """The plan of ``apply --devices-per-node N``: DeviceClasses alone when every node of the driver is
    split and their reserved GPUs sit in the same PCI slots; DeviceTaintRules as well when some nodes
    only are chosen (``chosen``: given by a partial release), or the slots differ, and the rules may be
    used; refused (a subset) or the union of the slots (differing slots) otherwise."""
    state = state if state is not None else read_dra(api, policy, claims=True, required=True)
    require_v1(state)
    driver = policy.spec.reserved_devices.driver
    why_not = taint_rules_why_not(state, args)
    usable = why_not is None
    notes: list[str] = []
    if chosen is None:
        try:
            chosen = device_reservation.choose_device_nodes(
                cluster.nodes,
                state.published,
                cluster.plugin_gpus,
                reservation,
                driver,
                names=parse_names(args.nodes) if args.nodes is not None else None,
                selector=parse_selector(args.selector) if args.selector is not None else None,
                allow_subset=usable,
            )
        except SubsetError as err:
            raise SelectionError(device_reservation.subset_message(err, why_not or "")) from None
    subset = set(chosen) != set(state.published)
    _, wanted = device_reservation.split(state.published, args.devices_per_node, chosen)
    differ = device_reservation.slots_differ(state.published, wanted)
    by_taints = subset or (bool(differ) and usable)
    if by_taints:
        why = (
            f"only {', '.join(sorted(chosen))} of the driver's nodes are split"
            if subset
            else f"the reserved GPUs of {', '.join(differ)} sit in other PCI slots than their neighbours'"
        )
        notes.append(f"DeviceTaintRules hold the split: {why} (CEL cannot see the node)")
    elif differ:
        notes.append(f"DeviceTaintRules would reserve each node's own GPUs exactly, but {why_not}")
    after, wanted = device_reservation.split(state.published, args.devices_per_node, chosen, by_taints=by_taints)
    if not after.active:
        raise SelectionError(
            f"no {driver} device publishes {device_classes.PCI_BUS_ID_ATTRIBUTE}: the classes select devices by "
            "PCI bus ID, so none can be reserved"
        )
    held, held_notes = device_reservation.holds(state.claims, driver, state.published, cluster.pods, cluster.uids)
    notes += held_notes
    plugin = sorted(name for name, n in cluster.plugin_gpus.items() if n > 0 and name not in state.published)
    if plugin:
        notes.append(
            f"{', '.join(plugin)} serve{'s' if len(plugin) == 1 else ''} GPUs through the device plugin: not split "
            f"(device-level reservation needs the DRA driver; reserve such nodes whole with pool apply --nodes, or "
            f"move them to the DRA driver: {device_reservation.DOCS})"
        )
    return device_reservation.build_device_plan(
        policy,
        state.published,
        after,
        wanted,
        state.classes,
        held,
        notes,
        nodes={n.name: n for n in cluster.nodes},
        rules=state.rules,
        rule_version=state.rule_version,
    )


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


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


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
        ours=lambda obj: device_reservation.class_info(obj).ours,
        replace_body=device_reservation.replace_body,
        dry_run=dry_run,
    )


def _loses(ours: Mapping[str, Any] | None, others: Iterable[ClassInfo]) -> ClassInfo | None:
    """The class that wins over ``ours`` for the extended resource name, or None when ours wins."""
    if ours is None:
        return None
    info = device_reservation.class_info(ours)
    best = device_reservation.winner([info, *others])
    return best if best is not None and best.name != info.name else None


def recreate_class(
    api: KubeApi,
    desired: Mapping[str, Any],
    current: Mapping[str, Any],
    owner: device_reservation.Ownership,
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
        if beaten is not None and beaten.created_seconds > device_reservation.class_info(current).created_seconds
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
            created_at = device_reservation.class_info(current).created
            return ObjectWritten(
                name,
                "recreated",
                f"{why}; now it is the newest class naming {owner.name} (created {created_at}): the scheduler maps "
                "the name to it",
                current,
            )
        if winner.created_seconds > device_reservation.class_info(current).created_seconds:
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
    """The reserved class first, then the shared one (not written when the reserved one was not: the shared
    class alone would split the devices differently from the reserved class)."""
    reserved, shared = plan.classes
    written = [write_class(api, reserved.desired, reserved.current, dry_run=dry_run)]
    on_written(written[0])
    if not written[0].ok:
        skipped = ObjectWritten(shared.name, "skipped", f"not written: deviceclass/{reserved.name} was not")
        on_written(skipped)
        return [*written, skipped]
    result = _write_shared(api, shared, plan.owner, dry_run=dry_run, ensure_owner=ensure_owner)
    on_written(result)
    return [*written, result]


def _write_shared(
    api: KubeApi, change: ClassChange, owner: device_reservation.Ownership, *, dry_run: bool, ensure_owner: bool
) -> ObjectWritten:
    if ensure_owner and change.action == "recreate" and change.current is not None:
        return recreate_class(api, change.desired, change.current, owner, dry_run=dry_run)
    written = write_class(api, change.desired, change.current, dry_run=dry_run)
    # A class created now is the newest, unless another one was created the same second with a lower name.
    created = written.object if written.result == "created" and not dry_run else None
    if ensure_owner and owner.name and created is not None and _loses(created, owner.others) is not None:
        return recreate_class(api, change.desired, created, owner, dry_run=dry_run)
    return written


def write_rule(api: KubeApi, change: device_reservation.RuleChange, version: str, *, dry_run: bool) -> ObjectWritten:
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


def _written_json(written: ObjectWritten) -> dict[str, Any]:
    return {"name": written.name, "result": written.result, "message": written.message or None}


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
        return device_reservation.unsplit_label_patch(node, label)

    def split_it(node: PoolNode) -> dict[str, Any] | None:
        return device_reservation.split_label_patch(node, label)

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
            out.line(_written_line(result, verb, dry_run))
    return written


def _nodes_json(written: Iterable[Written]) -> list[dict[str, Any]]:
    return [{"name": w.node, "result": w.result, "patch": w.patch} for w in written]


def apply_devices(
    api: KubeApi, policy: Policy, cluster: Cluster, plan: DevicePlan, args: argparse.Namespace, out: Output
) -> int:
    """The classes first (the reserved one, then the shared one), then the split nodes' label (inference
    may be placed on them once their devices are split), then the evictions."""
    dry_run = args.dry_run == "server"
    table = args.output == "table"
    written, labelled, rules, classes_ok = write_split(
        api, policy, cluster, plan, out, dry_run=dry_run, table=table, ensure_owner=True
    )
    evictions: list[EvictionResult] = []
    if args.evict and classes_ok:
        evictions = evict_pods(
            [h.pod for h in plan.evicting],
            evictor(api, dry_run=dry_run),
            timeout=args.timeout,
            backoff_initial=EVICTION_BACKOFF[0],
            backoff_max=EVICTION_BACKOFF[1],
            on_result=(lambda r: out.line(_eviction_line(r))) if table else None,
        )
    elif table and args.evict and plan.evicting:
        out.line("No pod was evicted: the classes or the nodes' labels were not written.")
    elif table and plan.evicting:
        out.line(
            f"The pods listed above keep their devices: pool apply --devices-per-node {plan.after.devices_per_node} "
            "--evict evicts them."
        )
    ok = classes_ok and all(e.done for e in evictions)
    unchanged = (
        all(w.result == "unchanged" for w in written) and all(w.result == "unchanged" for w in labelled) and not rules
    )
    if table and ok and not evictions and unchanged:
        out.line("Nothing changed: the classes, the rules and the nodes already said this.")
    if not table:
        out.json(
            {
                "plan": {"devices": device_reservation.plan_json(plan)},
                "dryRun": dry_run,
                "deviceClasses": [_written_json(w) for w in written],
                "deviceTaintRules": [_written_json(r) for r in rules],
                "nodes": _nodes_json(labelled),
                "evictions": [
                    {
                        "namespace": e.pod.namespace,
                        "name": e.pod.name,
                        "outcome": e.outcome,
                        "message": e.message,
                        "attempts": e.attempts,
                    }
                    for e in evictions
                ],
            }
        )
    return EXIT_OK if ok else EXIT_NOT_DONE


def release_devices(api: KubeApi, policy: Policy, cluster: Cluster, args: argparse.Namespace, out: Output) -> int:
    """Both classes widened to every device of the driver (``RELEASED_RESERVATION``), never deleted: the
    shared class keeps the extended resource name (deleting the class it maps to leaves it unmapped,
    kubernetes/kubernetes#141103)."""
    state = read_dra(api, policy, claims=True, required=True)
    require_v1(state)
    devices = policy.spec.reserved_devices
    every = sorted(state.published)
    if args.nodes is not None:
        names = parse_names(args.nodes)
        known = {n.name for n in cluster.nodes} | set(every)
        unknown = [name for name in names if name not in known]
        if unknown:
            raise SelectionError(f"node{'s' if len(unknown) > 1 else ''} not found: {', '.join(unknown)}")
        if set(names) != set(every):
            why_not = taint_rules_why_not(state, args)
            if why_not is not None:
                err = SubsetError(f"--nodes {','.join(names)}", names, every, devices.driver)
                raise SelectionError(device_reservation.subset_message(err, why_not))
            current = device_reservation.current_reservation(policy, state.classes)
            if current is not None and current.active:
                current = device_classes.with_tainted(current, device_taint_rules.tainted_keys(state.rules))
                remaining = sorted(device_reservation.split_nodes(state.published, current) - set(names))
                if remaining:
                    # The others stay split, as they are: an apply of the same N on them, by taints.
                    args.devices_per_node = current.devices_per_node
                    plan = device_plan(
                        api, policy, cluster, Reservation.from_policy(policy), args, state=state, chosen=remaining
                    )
                    return apply_devices(api, policy, cluster, plan, args, out)
    table = args.output == "table"
    dry_run = args.dry_run == "server"
    if devices.reserved_class_name not in state.classes and devices.shared_class_name not in state.classes:
        if table:
            out.line(
                f"No device reservation: deviceclass/{devices.reserved_class_name} does not exist; nothing to release."
            )
        else:
            out.json({"released": False, "dryRun": dry_run, "deviceClasses": []})
        return EXIT_OK
    held, notes = device_reservation.holds(state.claims, devices.driver, state.published, cluster.pods, cluster.uids)
    plan = device_reservation.build_device_plan(
        policy,
        state.published,
        device_classes.RELEASED_RESERVATION,
        {},
        state.classes,
        held,
        notes,
        ensure_owner=False,
        nodes={n.name: n for n in cluster.nodes},
        rules=state.rules,  # every rule of ours is deleted, after the classes are widened
        rule_version=state.rule_version,
    )
    written, labelled, rules, ok = write_split(
        api, policy, cluster, plan, out, dry_run=dry_run, table=table, ensure_owner=False
    )
    if (
        table
        and ok
        and all(w.result == "unchanged" for w in written)
        and all(w.result == "unchanged" for w in labelled)
        and not rules
    ):
        out.line("Nothing changed: the device reservation was already released.")
    if not table:
        out.json(
            {
                "released": ok,
                "dryRun": dry_run,
                "plan": {"devices": device_reservation.plan_json(plan)},
                "deviceClasses": [_written_json(w) for w in written],
                "deviceTaintRules": [_written_json(r) for r in rules],
                "nodes": _nodes_json(labelled),
            }
        )
    return EXIT_OK if ok else EXIT_NOT_DONE


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
        for line in device_reservation.plan_lines(plan, policy):
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
