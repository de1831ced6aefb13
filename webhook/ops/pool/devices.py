"""``pool plan|apply --devices-per-node N`` and ``pool release --devices``: device-level reservation on the
nodes whose GPUs AMD's DRA driver publishes. The plan (``device_plan.build_device_plan``) from what was read
once; ``apply`` writes it (``pool_write.write_split``) and, with ``--evict``, evicts the pods of other
classes holding devices that became reserved; a release widens both classes to every device (never deletes
them), or, with DeviceTaintRules, splits the nodes left as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from webhook.cluster.kubeapi import KubeApi
from webhook.core.policy import Policy
from webhook.deploy import device_classes, device_taint_rules
from webhook.ops.capacity import split_nodes
from webhook.ops.devices.memory_mode import PinError, choose, other_mode_holders
from webhook.ops.devices.ownership import current_reservation
from webhook.ops.devices.plan import DevicePlan, build_device_plan, claims_of_pods_gone, holds, plan_json, plan_lines
from webhook.ops.devices.split import (
    DOCS,
    SubsetError,
    choose_device_nodes,
    slots_differ,
    split,
    subset_message,
    taint_rules_unusable,
)
from webhook.ops.pool.eviction import EvictionResult
from webhook.ops.pool.output import EXIT_NOT_DONE, EXIT_OK, Output
from webhook.ops.pool.read import Cluster, DraState, PoolRead, capacity_model
from webhook.ops.pool.write import evict, evictions_json, nodes_json, write_split, written_json
from webhook.ops.reservation import Reservation, SelectionError, parse_names, parse_selector


def plan_or_apply(
    args: argparse.Namespace, api: KubeApi, policy: Policy, read: PoolRead, reservation: Reservation, out: Output
) -> int:
    """``plan --devices-per-node N`` (printed) or ``apply --devices-per-node N``."""
    plan = plan_devices(policy, read.cluster, read.devices, reservation, args)
    if args.action == "plan":
        if args.output == "json":
            out.json({"devices": plan_json(plan)})
        else:
            for line in plan_lines(plan, policy):
                out.line(line)
        return EXIT_OK
    return apply_devices(api, policy, read.cluster, plan, args, out)


def require_v1(state: DraState) -> None:
    if state.version != "v1":
        served = f"resource.k8s.io/{state.version}" if state.version else "no resource.k8s.io version"
        raise SelectionError(
            f"device-level reservation writes resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 or later; "
            f"extendedResourceName needs 1.36): this cluster serves {served}"
        )


def taint_rules_why_not(state: DraState, args: argparse.Namespace) -> str | None:
    """Why DeviceTaintRules may not hold the split here (``device_split.taint_rules_unusable``)."""
    return taint_rules_unusable(
        state.rule_versions, state.server_version, opted_in=bool(getattr(args, "device_taint_rules", False))
    )


def plan_devices(
    policy: Policy,
    cluster: Cluster,
    state: DraState,
    reservation: Reservation,
    args: argparse.Namespace,
    *,
    chosen: Sequence[str] | None = None,
) -> DevicePlan:
    """The plan of ``apply --devices-per-node N``: DeviceClasses alone when every node of the driver is
    split and their reserved GPUs sit in the same PCI slots; DeviceTaintRules as well when some nodes
    only are chosen (``chosen``: given by a partial release), or the slots differ, and the rules may be
    used; refused (a subset) or the union of the slots (differing slots) otherwise."""
    require_v1(state)
    driver = policy.spec.reserved_devices.driver
    why_not = taint_rules_why_not(state, args)
    usable = why_not is None
    notes: list[str] = []
    if chosen is None:
        try:
            chosen = choose_device_nodes(
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
            raise SelectionError(subset_message(err, why_not or "")) from None
    subset = set(chosen) != set(state.published)
    _, wanted = split(state.published, args.devices_per_node, chosen)
    differ = slots_differ(state.published, wanted)
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
    after, wanted = split(state.published, args.devices_per_node, chosen, by_taints=by_taints)
    if not after.active:
        raise SelectionError(
            f"no {driver} device publishes {device_classes.PCI_BUS_ID_ATTRIBUTE}: the classes select devices by "
            "PCI bus ID, so none can be reserved"
        )
    held = holds(capacity_model(policy, PoolRead(cluster, state), reservation), cluster.pods)
    # AutoPartition: the node-wide memory mode is pinned, never left open (ops/devices/memory_mode.py).
    try:
        pin = choose(
            policy,
            state.published,
            current_reservation(policy, state.classes),
            (d for h in held if h.pod.inference for d in h.devices),
            args.devices_per_node,
        )
    except PinError as err:
        raise SelectionError(str(err)) from None
    after = replace(after, memory_partition=pin.mode)
    for node, pod, other in other_mode_holders(
        pin.mode, ((f"{h.pod.namespace}/{h.pod.name}", h.devices) for h in held)
    ):
        notes.append(
            f"{node}: {pod} holds {', '.join(d.name for d in other)} (memory mode {other[0].memory_partition}): "
            f"until it ends, {node} stays in that mode and the driver keeps its {pin.mode} layouts tainted, for "
            "both sides"
        )
    notes += claims_of_pods_gone(state.claims, driver, cluster.pods, cluster.uids)
    plugin = sorted(name for name, n in cluster.plugin_gpus.items() if n > 0 and name not in state.published)
    if plugin:
        notes.append(
            f"{', '.join(plugin)} serve{'s' if len(plugin) == 1 else ''} GPUs through the device plugin: not split "
            f"(device-level reservation needs the DRA driver; reserve such nodes whole with pool apply --nodes, or "
            f"move them to the DRA driver: {DOCS})"
        )
    return build_device_plan(
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
        memory=pin,
    )


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
        evictions = evict(api, [h.pod for h in plan.evicting], args, out, dry_run=dry_run, table=table)
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
                "plan": {"devices": plan_json(plan)},
                "dryRun": dry_run,
                "deviceClasses": [written_json(w) for w in written],
                "deviceTaintRules": [written_json(r) for r in rules],
                "nodes": nodes_json(labelled),
                "evictions": evictions_json(evictions),
            }
        )
    return EXIT_OK if ok else EXIT_NOT_DONE


def release_devices(
    api: KubeApi, policy: Policy, cluster: Cluster, state: DraState, args: argparse.Namespace, out: Output
) -> int:
    """Both classes widened to every device of the driver (``RELEASED_RESERVATION``), never deleted: the
    shared class keeps the extended resource name (deleting the class it maps to leaves it unmapped,
    kubernetes/kubernetes#141103)."""
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
                raise SelectionError(subset_message(err, why_not))
            current = current_reservation(policy, state.classes)
            if current is not None and current.active:
                current = device_classes.with_tainted(current, device_taint_rules.tainted_keys(state.rules))
                remaining = sorted(split_nodes(state.published, current) - set(names))
                if remaining:
                    # The others stay split, as they are: an apply of the same N on them, by taints.
                    args.devices_per_node = current.devices_per_node
                    plan = plan_devices(policy, cluster, state, Reservation.from_policy(policy), args, chosen=remaining)
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
    held = holds(capacity_model(policy, PoolRead(cluster, state), Reservation.from_policy(policy)), cluster.pods)
    notes = claims_of_pods_gone(state.claims, devices.driver, cluster.pods, cluster.uids)
    plan = build_device_plan(
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
                "plan": {"devices": plan_json(plan)},
                "deviceClasses": [written_json(w) for w in written],
                "deviceTaintRules": [written_json(r) for r in rules],
                "nodes": nodes_json(labelled),
            }
        )
    return EXIT_OK if ok else EXIT_NOT_DONE
