"""Instructions per ``decide()`` call, counted by valgrind's callgrind: repeatable on a busy machine.

Wall-clock micro-benchmarks on a shared 2-core virtual machine move by 2x from one run to the next
(other processes, steal time); an instruction count does not. For each bench review, the program runs
``decide()`` 0 and N times under callgrind; the difference divided by N is one call's instructions
(interpreter start-up and imports cancel out). Run it on two trees to compare a change:

    python -m bench.instructions                 # this tree (compiled when webhook/*.so are there)
    PYTHONPATH=/path/to/other/tree python -m bench.instructions

Needs valgrind (Debian's package). Prints one JSON object: review -> instructions per call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

CALLS = {"large": 200}  # the large pod takes ~10x longer per call: fewer calls, same precision
DEFAULT_CALLS = 2000


def run_decide(name: str, calls: int) -> None:
    """The measured program: ``calls`` decisions of one review, as the HTTPS benchmark sends it."""
    from bench import policies, reviews
    from webhook.core.decision import NamespaceFacts, NodeFacts
    from webhook.core.engine import decide

    policy = policies.policy(1)
    request = reviews.BUILDERS[name]()["request"]
    namespace = request["namespace"]
    labels = {"rocm-isolation.io/class": "inference" if namespace == reviews.INFERENCE_NAMESPACE else "training"}
    facts = NamespaceFacts(namespace, labels)
    nodes = NodeFacts(frozenset({"gpu-r1"}))
    pod = request["object"]
    for _ in range(calls):
        decide(operation="CREATE", pod=pod, namespace=facts, nodes=nodes, policy=policy)


def instructions(name: str, calls: int) -> int:
    """All instructions of one run of the program under callgrind."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "bench.instructions", "--run", name, str(calls),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True, env=dict(os.environ))
    found = re.search(r"Collected : (\d+)", result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{result.stderr}")
    return int(found.group(1))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--run"]:
        run_decide(argv[1], int(argv[2]))
        return 0
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    from bench import reviews

    out = {}
    for name in reviews.BUILDERS:
        calls = CALLS.get(name, DEFAULT_CALLS)
        out[name] = round((instructions(name, calls) - instructions(name, 0)) / calls)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
