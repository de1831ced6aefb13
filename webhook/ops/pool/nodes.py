"""``pool plan|apply|release`` of whole nodes: the nodes chosen (``reservation.py`` plans), our label and
taint written on them or taken away, the pods the taint leaves evicted (``--evict``), the backstop's
reserved-names ConfigMap synced. A node is reserved whole or split, never both: a node the active device
reservation splits is refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import Policy
from webhook.deploy import device_classes, device_taint_rules
from webhook.ops.capacity import split_nodes
from webhook.ops.devices.ownership import current_reservation
from webhook.ops.devices.plan import reservation_text
from webhook.ops.devices.split import split_labelled
from webhook.ops.pool.eviction import EvictionResult
from webhook.ops.pool.output import EXIT_NOT_DONE, EXIT_OK, Output, pod_ref
from webhook.ops.pool.read import Cluster, DraState, PoolRead
from webhook.ops.pool.write import (
    Written,
    evict,
    evictions_json,
    nodes_json,
    reserve_verb,
    sync_reserved_names,
    write_node,
    written_line,
)
from webhook.ops.reservation import (
    Plan,
    Reservation,
    SelectionError,
    build_plan,
    choose_nodes,
    columns,
    parse_names,
    parse_selector,
    plan_json,
    plan_lines,
    release_patch,
    reserve_patch,
    room_after_release,
)


def plan_or_apply(
    args: argparse.Namespace, api: KubeApi, policy: Policy, read: PoolRead, reservation: Reservation, out: Output
) -> int:
    """``plan`` (printed) or ``apply`` of the nodes ``--nodes``/``--selector``/``--count``/``--gpus`` choose."""
    cluster = read.cluster
    selection = choose_nodes(
        cluster.nodes,
        cluster.pods,
        reservation,
        names=parse_names(args.nodes) if args.nodes is not None else None,
        selector=parse_selector(args.selector) if args.selector is not None else None,
        count=args.count,
        gpus=args.gpus,
    )
    refuse_split_nodes(policy, read.devices, [c.node.name for c in selection.chosen], out)
    plan = build_plan(selection, cluster.nodes, cluster.pods, reservation)
    if args.action == "plan":
        if args.output == "json":
            out.json(plan_json(plan))
        else:
            for line in plan_lines(plan):
                out.line(line)
        return EXIT_OK
    return apply(api, policy, plan, args, out)


def refuse_split_nodes(policy: Policy, state: DraState, names: Iterable[str], out: Output) -> None:
    """A node is reserved whole or split, never both: whole-node ``plan``/``apply`` refuse a node whose
    devices the active device reservation splits."""
    for warning in state.warnings:
        out.warning(f"{warning}: cannot check that no chosen node's devices are split")
    current = current_reservation(policy, state.classes)
    if current is None or not current.active:
        return
    current = device_classes.with_tainted(current, device_taint_rules.tainted_keys(state.rules))
    split_now = split_nodes(state.published, current)
    refused = sorted(name for name in names if name in split_now)
    if refused:
        devices = policy.spec.reserved_devices
        raise SelectionError(
            f"{', '.join(refused)} publish{'es' if len(refused) == 1 else ''} {devices.driver} devices, "
            f"which the active device reservation splits (deviceclass/{devices.reserved_class_name}: "
            f"{reservation_text(current)}): a node is reserved whole or split, never both. "
            "Release the device reservation first (pool release --devices --all"
            + (f", or --nodes {','.join(refused)}" if current.by_taints else "")
            + "), or choose nodes without the DRA driver"
        )


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
            out.line(written_line(result, reserve_verb(result.patch or {}), dry_run))
    names = sync_reserved_names(api, policy, dry_run=dry_run, out=out, table=table)
    evictions: list[EvictionResult] = []
    if args.evict:
        staying = [p for n in plan.nodes for p in n.staying]
        evictions = evict(api, staying, args, out, dry_run=dry_run, table=table)
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
                "nodes": nodes_json(written),
                "reservedNodeNames": names,
                "evictions": evictions_json(evictions),
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
            n.name for n in cluster.nodes if n.marked(reservation) and not split_labelled(n, reservation, split_value)
        )
    else:
        names = parse_names(args.nodes)
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise SelectionError(f"node{'s' if len(unknown) > 1 else ''} not found: {', '.join(unknown)}")
        split = [name for name in names if split_labelled(by_name[name], reservation, split_value)]
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
            out.json({"released": False, "homeless": [pod_ref(p) for p in homeless], "nodes": []})
        return EXIT_NOT_DONE
    written = [
        write_node(api, by_name[name], lambda n: release_patch(n, reservation), policy, dry_run=dry_run)
        for name in names
    ]
    if table:
        if not names:
            out.line("The pool has no nodes: nothing to release.")
        for w in written:
            out.line(written_line(w, "released (label and taint removed)", dry_run))
        if homeless:
            out.line(f"warning: --force: {len(homeless)} inference pod(s) have no room left in the pool")
    reserved_node_names = sync_reserved_names(api, policy, dry_run=dry_run, out=out, table=table)
    if not table:
        out.json(
            {
                "released": True,
                "dryRun": dry_run,
                "homeless": [pod_ref(p) for p in homeless],
                "nodes": nodes_json(written),
                "reservedNodeNames": reserved_node_names,
            }
        )
    done = all(w.result in ("patched", "unchanged") for w in written) and reserved_node_names["result"] != "failed"
    return EXIT_OK if done else EXIT_NOT_DONE
