"""How ``pool`` answers: its exit codes and one ``Output`` (lines, warnings, errors, JSON) that every verb
prints through."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from webhook.ops.reservation import PoolPod

EXIT_OK = 0


EXIT_NOT_DONE = 1


EXIT_BAD = 2


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


def pod_ref(pod: PoolPod) -> dict[str, Any]:
    return {"namespace": pod.namespace, "name": pod.name, "node": pod.node, "gpus": pod.gpus}
