"""pytest hooks and fixtures of the end-to-end suite (tests/e2e, a package: its modules never shadow
tests/conftest.py or the unit tests' modules). The harness itself is harness.py and controlplane.py.

Without the binaries (``KUBEBUILDER_ASSETS``, see controlplane.HOW_TO_GET_BINARIES) the suite's tests
are deselected and one notice says so at the end of the run; the rest of ``make test`` is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .controlplane import (
    ASSETS_ENV,
    HOW_TO_GET_BINARIES,
    KUBE_MINOR_ENV,
    LOOPBACK,
    MAP_OPT_IN_ENV,
    MINORS,
    NATIVE_MINOR,
    ControlPlane,
    kube_minor,
    loopback_only,
    map_opt_in,
    minor_options,
    missing_binaries,
)
from .harness import (
    DEVICE_CLASS,
    E2E_DIR,
    MI210_LABELS,
    MI300X_LABELS,
    NIC_DEVICE_CLASS,
    POOL_NODES,
    RESERVED_NODES,
    SHARED_NODES,
    Cluster,
    cli,
    deploy,
    make_node,
    resource_slice,
    serves_dra,
    wait_reserved_nodes_known,
)
from .kube import Kube


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("e2e", "the end-to-end suite (tests/e2e)")
    group.addoption(
        "--kube-minor",
        choices=MINORS,
        help=f"the Kubernetes minor the control plane emulates (--emulated-version; also ${KUBE_MINOR_ENV}); on one "
        f"before {NATIVE_MINOR} only the tests marked minors(...) with it run. Default: {NATIVE_MINOR}, every test",
    )
    group.addoption(
        "--map-opt-in",
        action="store_true",
        help=f"with the MutatingAdmissionPolicy opt-in of 1.35 (1.34 serves its API too; also ${MAP_OPT_IN_ENV}=1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The webhook ServiceAccount's username is longer than RFC 5280's CN bound (see controlplane.Pki).
    config.addinivalue_line("filterwarnings", "ignore:Attribute's length must be:UserWarning")
    config.addinivalue_line("markers", "e2e: end-to-end test on a real control plane (needs KUBEBUILDER_ASSETS)")
    config.addinivalue_line(
        "markers",
        "minors(*minors): the Kubernetes minors before 1.36 this end-to-end test also runs on (--kube-minor); "
        "unmarked: 1.36 only",
    )
    # The option sets the variable, so the harness and the processes it starts read one setting.
    if config.getoption("--kube-minor", None):
        os.environ[KUBE_MINOR_ENV] = config.getoption("--kube-minor")
    if config.getoption("--map-opt-in", False):
        os.environ[MAP_OPT_IN_ENV] = "1"


def _is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.path)).parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e = [item for item in items if _is_e2e(item)]
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    minor = kube_minor()
    if minor != NATIVE_MINOR:
        # An older minor: the tests of what a stock cluster of it serves (each says so with minors(...)).
        other = [item for item in e2e if not any(minor in m.args for m in item.iter_markers("minors"))]
        if other:
            config.hook.pytest_deselected(items=other)
            left = {id(item) for item in other}
            items[:] = [item for item in items if id(item) not in left]
            e2e = [item for item in e2e if id(item) not in left]
        config.stash[_MINOR] = (minor, len(other))
    missing = missing_binaries(os.environ.get(ASSETS_ENV))
    if not e2e or not missing:
        return
    # Deselected, not skipped: one notice for the whole suite instead of a skip line per test (-ra).
    config.hook.pytest_deselected(items=e2e)
    items[:] = [item for item in items if not _is_e2e(item)]
    config.stash[_SKIPPED] = (len(e2e), missing)


_SKIPPED = pytest.StashKey[tuple[int, list[str]]]()
_MINOR = pytest.StashKey[tuple[str, int]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    on_minor = config.stash.get(_MINOR, None)
    if on_minor is not None:
        minor, left_out = on_minor
        opt_in = " with the MutatingAdmissionPolicy opt-in" if map_opt_in() else ""
        terminalreporter.write_line(
            f"NOTE: the end-to-end suite ran on Kubernetes {minor} (--emulated-version=kube={minor}){opt_in}: "
            f"{left_out} tests of what {minor} does not serve stock were deselected"
        )
    skipped = config.stash.get(_SKIPPED, None)
    if skipped is None:
        return
    count, missing = skipped
    where = os.environ.get(ASSETS_ENV)
    why = f"{ASSETS_ENV}={where} lacks {', '.join(missing)}" if where else f"{ASSETS_ENV} is not set"
    terminalreporter.write_sep("=", "end-to-end suite skipped", yellow=True, bold=True)
    terminalreporter.write_line(
        f"NOTE: the {count} end-to-end tests (tests/e2e, a real kube-apiserver) did not run: {why}. "
        f"To run them, {HOW_TO_GET_BINARIES}.",
        yellow=True,
    )


# --- the webhook process --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    assets = os.environ[ASSETS_ENV]
    loopback_only()
    plane = ControlPlane(Path(assets), tmp_path_factory.mktemp("controlplane"), **minor_options())
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    plane = control_plane
    kube = Kube(LOOPBACK, plane.apiserver_port, plane.ssl_context())
    workdir = tmp_path_factory.mktemp("e2e")
    for name in RESERVED_NODES + SHARED_NODES:
        make_node(kube, name, MI300X_LABELS)
    for name in POOL_NODES:
        make_node(kube, name, MI210_LABELS)
    if serves_dra():  # 1.34 on: AMD's DRA driver's DeviceClass and slices (1.33 serves no resource.k8s.io)
        kube.apply(DEVICE_CLASS)
        kube.apply(NIC_DEVICE_CLASS)
        for name in RESERVED_NODES + SHARED_NODES:
            kube.apply(resource_slice(name, "AMD_Instinct_MI300X_OAM", "74a1"))
        for name in POOL_NODES:
            kube.apply(resource_slice(name, "Instinct_MI210", "740f"))

    deployed = deploy(plane, workdir)

    # The reserved pool, with the project's own command (an operator's kubeconfig: the admin's).
    result = cli("pool", "apply", "--nodes", ",".join(RESERVED_NODES), kubeconfig=plane.admin_kubeconfig)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_reserved_nodes_known(kube, RESERVED_NODES[0])
    yield Cluster(plane, kube, deployed.webhook, deployed.kubeconfig, workdir, deployed.manifests)
    plane.check_alive()


_namespace_serial = 0


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """A factory of namespaces named after the test, cleaned up when it ends."""
    made: list[str] = []
    global _namespace_serial
    _namespace_serial += 1
    base = f"{request.node.originalname.replace('_', '-').lower()[:40].strip('-')}-{_namespace_serial}"

    def make(suffix: str = "", labels: dict[str, str] | None = None) -> str:
        name = f"{base}-{suffix}".strip("-")[:63] if suffix else base
        made.append(cluster.namespace(name, labels))
        return name

    yield make
    for name in made:
        cluster.cleanup(name)
