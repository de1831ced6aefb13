"""The ``rocm-isolation-webhook`` command: one subcommand per module, each with
``add_arguments(parser)`` and ``main(args) -> exit code``, imported only when used.

The same command is the kubectl plugin ``kubectl-rocm_isolation`` (krew's naming: ``kubectl
rocm-isolation audit``); kubectl passes the words after the plugin's name as they are, so its global
flags (``--kubeconfig``, ``--context``, ``-n``) reach the plugin before or after the subcommand, and
``plugin`` moves those given before it to after it, where the subcommand reads them."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from webhook import __version__

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("webhook.service.serve", "run the HTTPS admission webhook"),
    "mutate": (
        "webhook.offline.dryrun",
        "dry-run the policy on manifests offline (exit 1 when any object is denied)",
    ),
    "certs": ("webhook.service.certs", "generate a CA and a serving certificate for the webhook Service"),
    "manifests": ("webhook.deploy.render", "render the deployable Kubernetes manifests"),
    "audit": (
        "webhook.ops.audit.command",
        "check running pods, nodes and namespaces against the policy; reserved pool capacity (exit 1 on findings)",
    ),
    "pool": (
        "webhook.ops.pool.command",
        "plan, apply, release or show the reserved node pool (label and taint the nodes)",
    ),
}


PROG = "rocm-isolation-webhook"
PLUGIN_PROG = "kubectl rocm-isolation"
# kubectl's global flags that the subcommands take (audit, pool: all three; mutate: -n)
KUBECTL_FLAGS = ("--kubeconfig", "--context", "-n", "--namespace")


def build_parser(argv: Sequence[str], prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Kubernetes admission webhook that keeps GPU training off the ROCm nodes reserved for inference.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((arg for arg in argv if arg in SUBCOMMANDS), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported: `mutate` must not pay for uvicorn.
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(handler=module.main)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list, prog)
    args = parser.parse_args(args_list)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"unknown command {args.command!r}")
    result: int = handler(args)
    return result


def global_flags_after_subcommand(argv: Sequence[str]) -> list[str]:
    """kubectl's global flags given before the subcommand (``--context x audit``), moved after it."""
    moved: list[str] = []
    rest = list(argv)
    while rest and rest[0] not in SUBCOMMANDS:
        word = rest[0]
        name = word.split("=", 1)[0]
        if name in KUBECTL_FLAGS:
            takes_value = "=" not in word
            moved.extend(rest[: 2 if takes_value else 1])
            del rest[: 2 if takes_value else 1]
        elif word.startswith("-n") and len(word) > 2 and not word.startswith("--"):
            moved.append(word)  # -nNAMESPACE
            del rest[0]
        else:
            break  # --help, --version, a typo: the parser says what it is
    if not rest or rest[0] not in SUBCOMMANDS:
        return [*moved, *rest]
    return [rest[0], *moved, *rest[1:]]


def plugin(argv: Sequence[str] | None = None) -> int:
    """``kubectl-rocm_isolation``: the kubectl plugin (``kubectl rocm-isolation audit | pool | mutate``)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    return main(global_flags_after_subcommand(args_list), PLUGIN_PROG)
