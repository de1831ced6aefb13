"""The kubectl plugin: ``kubectl-rocm_isolation`` (krew's naming), the console script that ``pip install``
puts next to the interpreter, run through a real ``kubectl`` (its plugin lookup on PATH, its passing of the
words after the plugin's name) and compared with ``python -m webhook``. kubectl's global flags
(``--kubeconfig``, ``--context``, ``-n``) reach the subcommand whether given before or after it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from audit_cluster import running
from fake_cluster import FakeCluster

from webhook import cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sys.executable).parent
PLUGIN = SCRIPTS / "kubectl-rocm_isolation"
FIXTURES = ROOT / "tests" / "fixtures" / "dryrun"


def _kubectl() -> str | None:
    envtest = ROOT / ".cache" / "envtest" / "bin" / "kubectl"
    if envtest.is_file():
        return str(envtest)
    return shutil.which("kubectl")


KUBECTL = _kubectl()
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH or in .cache/envtest/bin")


def env() -> dict[str, str]:
    """PATH with the virtualenv's scripts first, as after `pip install` into it; no ambient kubeconfig."""
    out = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    out["PATH"] = f"{SCRIPTS}{os.pathsep}{out.get('PATH', '')}"
    out["HOME"] = str(ROOT / ".cache" / "no-home")  # no ~/.kube/config of whoever runs the tests
    return out


def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "rocm-isolation", *args], capture_output=True, text=True, cwd=ROOT, env=env(), timeout=120
    )


def module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args], capture_output=True, text=True, cwd=ROOT, env=env(), timeout=120
    )


def test_the_console_script_is_installed_next_to_the_interpreter() -> None:
    assert PLUGIN.is_file(), f"{PLUGIN} missing: pip install -e . installs the pyproject.toml scripts"
    assert os.access(PLUGIN, os.X_OK)


@needs_kubectl
def test_kubectl_finds_the_plugin_on_path() -> None:
    assert KUBECTL is not None
    listed = subprocess.run([KUBECTL, "plugin", "list"], capture_output=True, text=True, env=env(), timeout=60)

    assert str(PLUGIN) in listed.stdout, listed.stdout + listed.stderr
    usage = kubectl("--help")
    assert usage.returncode == 0
    assert usage.stdout.startswith("usage: kubectl rocm-isolation")


@needs_kubectl
@pytest.mark.parametrize("fixture", ["workloads.yaml", "crds/kaiwo.yaml", "crds/pytorchjob-reserved.yaml"])
def test_kubectl_rocm_isolation_mutate_is_python_m_webhook_mutate(fixture: str) -> None:
    path = str(FIXTURES / fixture)
    plugin = kubectl("mutate", "-f", path)
    direct = module("mutate", "-f", path)

    assert plugin.stdout, plugin.stderr
    assert (plugin.returncode, plugin.stdout, plugin.stderr) == (direct.returncode, direct.stdout, direct.stderr)


UNNAMESPACED = """\
apiVersion: v1
kind: Pod
metadata:
  name: trainer
spec:
  containers:
    - name: t
      image: rocm/pytorch
      resources:
        limits:
          amd.com/gpu: 1
"""


@needs_kubectl
@pytest.mark.parametrize("where", ["after", "before", "joined"])
def test_the_namespace_flag_reaches_mutate_before_or_after_the_subcommand(where: str, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(UNNAMESPACED)
    args = {
        "after": ["mutate", "-f", str(manifest), "-n", "ml-training"],
        "before": ["-n", "ml-training", "mutate", "-f", str(manifest)],
        "joined": ["--namespace=ml-training", "mutate", "-f", str(manifest)],
    }[where]
    plugin = kubectl(*args)
    direct = module("mutate", "-f", str(manifest), "--namespace", "ml-training")

    assert plugin.returncode == 0, plugin.stderr
    assert "Pod/ml-training/trainer: mutated: class training" in plugin.stderr
    assert (plugin.stdout, plugin.stderr) == (direct.stdout, direct.stderr)
    assert "Pod/default/trainer" in module("mutate", "-f", str(manifest)).stderr


cluster = pytest.fixture(running, name="cluster")


def two_contexts(fake: FakeCluster, path: Path) -> Path:
    """A kubeconfig whose current-context is a cluster that is not there; context ``fake`` is the fake cluster."""
    path.write_bytes(
        orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": fake.url}},
                    {"name": "gone", "cluster": {"server": "http://127.0.0.1:1"}},
                ],
                "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                "contexts": [
                    {"name": "fake", "context": {"cluster": "fake", "user": "fake"}},
                    {"name": "gone", "context": {"cluster": "gone", "user": "fake"}},
                ],
                "current-context": "gone",
            }
        )
    )
    return path


def findings(result: subprocess.CompletedProcess[str]) -> list[Any]:
    found: list[Any] = json.loads(result.stdout)["findings"]
    return found


@needs_kubectl
def test_kubeconfig_and_context_reach_audit(cluster: FakeCluster, tmp_path: Path) -> None:
    config = str(two_contexts(cluster, tmp_path / "kubeconfig"))
    plugin = kubectl("audit", "--kubeconfig", config, "--context", "fake", "-o", "json")
    direct = module("audit", "--kubeconfig", config, "--context", "fake", "-o", "json")
    before = kubectl("--context", "fake", "--kubeconfig", config, "audit", "-o", "json")
    current = kubectl("audit", "--kubeconfig", config, "-o", "json")
    unknown = kubectl("audit", "--kubeconfig", config, "--context", "nowhere")

    assert plugin.returncode == direct.returncode == before.returncode == 1, plugin.stderr  # findings
    assert findings(plugin) == findings(direct) == findings(before)
    assert any(f["name"] == "trainer-on-reserved" for f in findings(plugin))
    # Without --context the kubeconfig's current-context is used: a cluster that is not there.
    assert current.returncode == 2 and "cannot read the cluster" in current.stderr
    assert unknown.returncode == 2 and "nowhere" in unknown.stderr


@needs_kubectl
def test_the_namespace_flag_narrows_audit_as_kubectl_does(cluster: FakeCluster, tmp_path: Path) -> None:
    config = str(two_contexts(cluster, tmp_path / "kubeconfig"))
    every = findings(kubectl("audit", "--kubeconfig", config, "--context", "fake", "-o", "json"))
    ml = findings(kubectl("-n", "ml", "audit", "--kubeconfig", config, "--context", "fake", "-o", "json"))

    # Pods of other namespaces and other Namespaces go (ml's own stays); cluster-scoped objects (nodes) stay.
    assert {f.get("namespace") for f in every if f["kind"] == "Pod"} >= {"ml", "serve"}
    assert {f.get("namespace") for f in ml if f["kind"] == "Pod"} == {"ml"}
    assert {f["name"] for f in every if f["kind"] == "Namespace"} - {"ml"}
    assert {f["name"] for f in ml if f["kind"] == "Namespace"} <= {"ml"}
    assert [f for f in ml if f["kind"] == "Node"] == [f for f in every if f["kind"] == "Node"]
    assert [f for f in ml if f["kind"] == "Node"]


@needs_kubectl
def test_kubeconfig_and_context_reach_pool(cluster: FakeCluster, tmp_path: Path) -> None:
    config = str(two_contexts(cluster, tmp_path / "kubeconfig"))
    plugin = kubectl("pool", "status", "--kubeconfig", config, "--context", "fake", "-n", "ml", "-o", "json")
    direct = module("pool", "status", "--kubeconfig", config, "--context", "fake", "-o", "json")
    current = kubectl("pool", "status", "--kubeconfig", config)

    assert plugin.returncode == direct.returncode, plugin.stderr
    assert json.loads(plugin.stdout) == json.loads(direct.stdout)
    assert json.loads(plugin.stdout)  # the fake cluster's pool, read through context fake
    assert current.returncode != 0 and current.returncode == module("pool", "status", "--kubeconfig", config).returncode


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["audit", "--context", "c"], ["audit", "--context", "c"]),
        (["--context", "c", "-n", "ns", "audit", "-o", "json"], ["audit", "--context", "c", "-n", "ns", "-o", "json"]),
        (["--kubeconfig=k", "-nns", "pool", "status"], ["pool", "--kubeconfig=k", "-nns", "status"]),
        (["--help"], ["--help"]),
        (["--context", "c"], ["--context", "c"]),
        (["--bogus", "audit"], ["--bogus", "audit"]),
    ],
)
def test_global_flags_before_the_subcommand_move_after_it(argv: list[str], expected: list[str]) -> None:
    assert cli.global_flags_after_subcommand(argv) == expected
