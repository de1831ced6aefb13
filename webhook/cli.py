"""The ``rocm-isolation-webhook`` command: one subcommand per module, each with
``add_arguments(parser)`` and ``main(args) -> exit code``, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from webhook import __version__

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("webhook.serve", "run the HTTPS admission webhook"),
    "mutate": (
        "webhook.dryrun",
        "dry-run the policy on manifests offline (exit 1 when any object is denied)",
    ),
    "certs": ("webhook.certs", "generate a CA and a serving certificate for the webhook Service"),
    "manifests": ("webhook.render", "render the deployable Kubernetes manifests"),
    "audit": (
        "webhook.audit",
        "check running pods, nodes and namespaces against the policy; reserved pool capacity (exit 1 on findings)",
    ),
    "pool": ("webhook.pool", "plan, apply, release or show the reserved node pool (label and taint the nodes)"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocm-isolation-webhook",
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


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"unknown command {args.command!r}")
    result: int = handler(args)
    return result
