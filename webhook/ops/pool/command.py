"""``rocm-isolation-webhook pool plan|apply|release|status``: label and taint the reserved nodes.

An operator's tool, run with a person's kubeconfig: it patches nodes and evicts pods, which the
webhook's service account may not do (its ClusterRole only reads). It never falls back to an
in-cluster service account.

- ``plan`` (the default) reads the cluster and prints what ``apply`` would do; it changes nothing.
- ``apply`` patches each chosen node (our label and taint only, see ``reservation.py``), re-reading
  a node and retrying when a concurrent edit makes the apiserver answer 409, and with ``--evict``
  evicts the non-inference pods the NoSchedule taint leaves in place (``pool/eviction.py``).
- ``release`` removes our label and taint, after checking that the inference pods on those nodes
  still have room on the reserved nodes left (or ``--force``).
- ``status`` shows the pool as it is: label/taint consistency, GPUs, pods by class; with ``--gpu-metrics``
  (``recommend``'s credential options for a URL) each reserved GPU's activity as AMD's exporter reports it.

Device-level reservation (``--devices-per-node N``; nodes whose GPUs AMD's DRA driver publishes): the N
GPUs with the lowest PCI bus IDs of every node of the driver go to inference, through two DeviceClasses
(``webhook.deploy.device_classes``; the planning is ``devices/plan.py``). ``apply`` writes the
reserved class, then the shared one (created, or replaced with the ``resourceVersion`` read: 409 → read
again and retry), keeps the shared class the one the scheduler maps ``amd.com/gpu`` to, labels the split
nodes with ``reservedDevices.nodeLabelValue`` (inference is placed on them), and with ``--evict`` evicts
the pods of other classes holding devices that became reserved; ``release --devices --all`` widens both
classes to every device (never deletes them) and removes the label; ``status`` adds a device section.

Exit status: 0 done (or nothing to do), 1 something was refused or not done (an eviction still
refused at ``--timeout``, a release refused, a node that kept changing under us), 2 the cluster
cannot be read or the input is wrong (unknown node, selector matching nothing, ...): nothing is
changed then.

This module is the command: its arguments, their checks, and ``run``, which reads the cluster once
(``pool/read.py``) and hands it to the verb: ``pool/nodes.py`` (whole nodes), ``pool/devices.py``
(``--devices-per-node``, ``--devices``) or ``pool/status.py``; every write is in ``pool/write.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from webhook.cluster import discovery
from webhook.cluster.kubeapi import ApiError, KubeApi
from webhook.core.policy import Policy, PolicyError, default_policy, load_policy
from webhook.deploy import minors
from webhook.ops.devices import minor as device_minor
from webhook.ops.pool import devices as pool_devices
from webhook.ops.pool import nodes as pool_nodes
from webhook.ops.pool import recommend as pool_recommend
from webhook.ops.pool import status as pool_status
from webhook.ops.pool.output import EXIT_BAD, EXIT_NOT_DONE, EXIT_OK, Output
from webhook.ops.pool.read import PoolRead, missing_device_backstop, read_pool
from webhook.ops.prometheus import CREDENTIALS
from webhook.ops.reservation import Reservation, SelectionError

__all__ = ["EXIT_BAD", "EXIT_NOT_DONE", "EXIT_OK", "add_arguments", "main", "run"]


ACTIONS = ("plan", "apply", "release", "status", "recommend")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")


EPILOG = (
    """\
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
    + pool_recommend.EXAMPLES
)


class UsageError(Exception):
    """Options that do not go together: exit 2 before anything is read."""


def duration(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``5m`` or ``1h`` (kubectl's ``--timeout`` spellings), or ``14d``
    (Prometheus's, for ``recommend --window``)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 300s, 5m, 1h, 14d)")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        default="plan",
        help="plan (default: print what apply would do), apply, release, status, recommend (size the reservation "
        "from inference's measured demand)",
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
    parser.add_argument(
        "--gpu-metrics",
        metavar="URL|FILE",
        help="status: also show each reserved GPU's activity as AMD's device metrics exporter reports it: a "
        "Prometheus URL scraping it (with recommend's --token, --token-file and TLS options) or a file of its "
        "/metrics text",
    )
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
    pool_recommend.add_arguments(parser, duration)


def check_usage(args: argparse.Namespace) -> None:
    action = args.action
    gpu_metrics = getattr(args, "gpu_metrics", None)
    if gpu_metrics is not None and action != "status":
        raise UsageError("--gpu-metrics is only for pool status")
    try:
        pool_recommend.check_usage(args)
    except pool_recommend.RecommendUsageError as err:
        raise UsageError(str(err)) from err
    if action == "recommend":  # its options, and the others it refuses: pool_recommend.check_usage
        return
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
        if gpu_metrics is not None and not gpu_metrics.startswith(("http://", "https://")) and _credentials(args):
            raise UsageError("--token, --token-file and the TLS options are for --gpu-metrics URL, not a file")
        if getattr(args, "token", None) is not None and getattr(args, "token_file", None) is not None:
            raise UsageError("give --token or --token-file, not both")
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


def _credentials(args: argparse.Namespace) -> bool:
    """Prometheus's credentials given (recommend's options: pool status takes them too, with --gpu-metrics)."""
    return any(getattr(args, name, None) for name in CREDENTIALS)


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
        if args.action == "recommend":  # history, not the cluster: no kubeconfig needed
            return pool_recommend.run(args, policy, out)
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


def read_served(api: KubeApi) -> minors.Served | None:
    """What the cluster's minor serves (API discovery, the apiserver's feature gates), None when unreadable."""
    try:
        return minors.from_cluster(*discovery.served(api, minors.DISCOVERED))
    except ApiError:
        return None


def run(args: argparse.Namespace, api: KubeApi, policy: Policy, out: Output) -> int:
    served = read_served(api)
    devices = getattr(args, "devices_per_node", None) is not None or getattr(args, "devices", False)
    refusal = device_minor.no_dra_refusal(served) if devices else None
    if refusal is not None:
        raise SelectionError(refusal)
    policy, notes = device_minor.policy_for(policy, served)
    for note in notes if args.action != "status" else ():
        out.warning(note)
    reservation = Reservation.from_policy(policy)
    read = read_pool(api, policy, args)
    if args.action == "status":
        return pool_status.show(args, policy, read, reservation, out)
    if args.action == "release" and getattr(args, "devices", False):
        return pool_devices.release_devices(api, policy, read.cluster, read.devices, args, out)
    if args.action == "release":
        return pool_nodes.release(api, policy, read.cluster, reservation, args, out)
    if getattr(args, "devices_per_node", None) is not None:
        code = pool_devices.plan_or_apply(args, api, policy, read, reservation, out)
        # Once planned (a refusal is said alone): what the split cannot hold on this cluster.
        for warning in split_warnings(api, policy, served, read):
            out.warning(warning)
        return code
    return pool_nodes.plan_or_apply(args, api, policy, read, reservation, out)


def split_warnings(api: KubeApi, policy: Policy, served: minors.Served | None, read: PoolRead) -> list[str]:
    """What a device split made here does not hold: AutoPartition's layouts without shared counters (an older
    minor), the device-level backstop missing (manifests rendered for a minor without DRA, or never applied)."""
    warnings = []
    lost = device_minor.layouts_without_counters(served, read.devices.published, policy.spec.reserved_devices.driver)
    if lost is not None:
        warnings.append(lost)
    missing = missing_device_backstop(api)
    if missing:
        names = ", ".join(f"validatingadmissionpolicy/{name}" for name in missing)
        warnings.append(
            f"the device-level backstop is not installed ({names} not found): while the webhook is down nothing in "
            "the apiserver keeps training claims off the reserved devices; apply the manifests rendered for this "
            "cluster (rocm-isolation-webhook manifests ... | kubectl apply -f -)"
        )
    return warnings
