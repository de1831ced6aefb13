"""How long ``mutate`` spends reading and printing YAML: manifest_yaml against the PyYAML path it replaced.

    .venv/bin/python -m bench.yaml_io

The stream is tests/fixtures/dryrun/workloads.yaml fifty times (350 documents). "PyYAML" is what
``mutate`` did before manifest_yaml: PyYAML's pure-Python SafeLoader (timestamps as strings) and
``dump_all`` of every document. manifest_yaml is timed with no document changed (each printed as it
came) and with every document changed (each re-read with ruamel.yaml, synced, written, checked).
Best of three runs each.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from webhook.offline import manifest_yaml

STREAM = "\n---\n".join([(Path(__file__).parent.parent / "tests/fixtures/dryrun/workloads.yaml").read_text()] * 50)


class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _annotated(body: Any) -> Any:
    changed = copy.deepcopy(body)
    changed.setdefault("metadata", {}).setdefault("annotations", {})["example.com/changed"] = "y"
    return changed


def pyyaml_path() -> str:
    bodies = [_annotated(body) for body in yaml.load_all(STREAM, Loader=_Loader) if body]
    return yaml.dump_all(bodies, Dumper=_Dumper, sort_keys=False, explicit_start=True, allow_unicode=True, width=2**16)


def manifest_yaml_path(change: bool) -> str:
    found = manifest_yaml.load(STREAM)
    return manifest_yaml.dump((doc.source, doc.body, _annotated(doc.body) if change else doc.body) for doc in found)


def best_of_three(run: Callable[[], str]) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    print(f"{len(STREAM.splitlines())} lines, {len(manifest_yaml.load(STREAM))} documents")
    print(f"PyYAML load + dump (before):          {best_of_three(pyyaml_path):.2f} s")
    print(f"manifest_yaml, no document changed:   {best_of_three(lambda: manifest_yaml_path(False)):.2f} s")
    print(f"manifest_yaml, every document changed: {best_of_three(lambda: manifest_yaml_path(True)):.2f} s")


if __name__ == "__main__":
    main()
