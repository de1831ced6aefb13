"""``cluster/discovery.py``: the kube-apiserver's feature gates from its /metrics (the lines below are what the
v1.36.2 apiserver emulating 1.35 answers; tests/e2e/test_e2e_minors.py reads them live)."""

from __future__ import annotations

from webhook.cluster.discovery import parse_feature_gates

METRICS_1_35 = """\
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRAExtendedResource",stage="ALPHA"} 0
kubernetes_feature_enabled{name="DRAPrioritizedList",stage="BETA"} 1
kubernetes_feature_enabled{name="DynamicResourceAllocation",stage=""} 1
kubernetes_feature_enabled{name="MutatingAdmissionPolicy",stage="BETA"} 0
apiserver_request_total{code="200",name="x"} 7
"""


def test_each_gate_is_read_with_its_stage() -> None:
    assert parse_feature_gates(METRICS_1_35) == {
        "DRAExtendedResource": (False, "ALPHA"),
        "DRAPrioritizedList": (True, "BETA"),
        "DynamicResourceAllocation": (True, ""),
        "MutatingAdmissionPolicy": (False, "BETA"),
    }


def test_metrics_without_the_gauge_give_no_gates() -> None:
    assert parse_feature_gates("apiserver_request_total 3\n") == {}
