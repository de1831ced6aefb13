"""The policy store: the last good policy stays in force, errors name their position."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from webhook.core.policy import PolicyError
from webhook.service.metrics import Metrics
from webhook.service.reload import PolicyStore

POLICY = Path(__file__).parents[1] / "fixtures" / "admission" / "policy.yaml"


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    shutil.copy(POLICY, path)
    return path


def failures(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("rocm_isolation_policy_reload_failures_total") or 0.0


def test_invalid_file_keeps_the_last_good_policy(policy_file: Path) -> None:
    metrics = Metrics()
    store = PolicyStore(policy_file, metrics=metrics)
    good = store.policy
    assert store.check() is False  # unchanged
    policy_file.write_text("apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\nspec: {classes: [\n")
    assert store.check() is False
    assert store.policy is good
    assert store.error is not None and "line" in store.error and "column" in store.error
    assert failures(metrics) == 1
    assert metrics.registry.get_sample_value("rocm_isolation_policy_last_reload_success") == 0
    assert store.check() is False
    assert failures(metrics) == 1  # reported once, not every poll


def test_schema_error_names_the_field(policy_file: Path) -> None:
    store = PolicyStore(policy_file)
    policy_file.write_text(POLICY.read_text().replace("defaultClass: training", "defaultClass: batch"))
    assert store.check() is False
    assert store.error is not None and "defaultClass" in store.error


def test_deleted_file_keeps_the_policy_and_a_restored_file_reloads(policy_file: Path) -> None:
    metrics = Metrics()
    store = PolicyStore(policy_file, metrics=metrics)
    good = store.policy
    policy_file.unlink()
    assert store.check() is False
    assert store.policy is good and store.error and "cannot read" in store.error
    policy_file.write_text(POLICY.read_text().replace("service-tests", "restored"))
    assert store.check() is True
    assert store.policy.name == "restored"
    assert store.error is None
    assert metrics.registry.get_sample_value("rocm_isolation_policy_last_reload_success") == 1


def test_symlink_swap_is_seen(tmp_path: Path) -> None:
    """A ConfigMap volume is updated by swapping the ..data symlink."""
    first, second = tmp_path / "v1", tmp_path / "v2"
    first.mkdir()
    second.mkdir()
    shutil.copy(POLICY, first / "policy.yaml")
    (second / "policy.yaml").write_text(POLICY.read_text().replace("service-tests", "swapped"))
    data = tmp_path / "..data"
    data.symlink_to(first)
    link = tmp_path / "policy.yaml"
    link.symlink_to(data / "policy.yaml")
    store = PolicyStore(link)
    tmp_link = tmp_path / "..data_tmp"
    tmp_link.symlink_to(second)
    tmp_link.replace(data)
    assert store.check() is True
    assert store.policy.name == "swapped"


def test_invalid_policy_at_startup_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: Nope\n")
    with pytest.raises(PolicyError):
        PolicyStore(path)


def test_default_policy_without_a_file() -> None:
    store = PolicyStore(None)
    assert store.policy.name == "default"
    assert store.check() is False
