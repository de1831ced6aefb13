"""The monitoring pack (``manifests --monitoring``, manifests/overlays/monitoring): a ServiceMonitor and a
PrometheusRule for the Prometheus Operator and a Grafana dashboard ConfigMap.

The two monitoring.coreos.com objects validate against tests/fixtures/schemas/monitoring.coreos.com-v1.yaml
(written from the operator's CRDs); the alert rules pass ``promtool check rules`` and the unit tests of
tests/fixtures/monitoring/alerts-test.yaml under ``promtool test rules`` (Debian's prometheus package,
installed by ``make promtool``; the tests are skipped, with the reason, where it is missing); a real
Prometheus from the same package scrapes a real ``serve`` with the ServiceMonitor's TLS settings and
evaluates the rules; every metric an alert or a panel reads is one the webhook exports or one of the
background audit's gauges; real kustomize builds the overlay combined with a certificate overlay.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import free_port, launch_server, make_pki, wait_for
from prometheus_client.metrics import MetricWrapperBase

from webhook.deploy import dashboard, render
from webhook.service import certs, metrics

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"
MONITORING = ROOT / "manifests" / "overlays" / "monitoring"
SCHEMA = yaml.safe_load((FIXTURES / "schemas" / "monitoring.coreos.com-v1.yaml").read_text(encoding="utf-8"))
K8S_VERSION = "1.37.0"
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}

# The background audit's gauges (issue 12: fixed names, exported by `serve --audit-interval-seconds`).
AUDIT_METRICS = {
    "rocm_isolation_audit_findings": {"rule"},
    "rocm_isolation_audit_runs_total": {"result"},
    "rocm_isolation_audit_last_success_timestamp_seconds": set(),
    "rocm_isolation_audit_leader": set(),
    "rocm_isolation_pool_nodes": {"pool"},
    "rocm_isolation_pool_gpus_allocatable": {"pool"},
    "rocm_isolation_pool_gpus_requested": {"pool", "class"},
    "rocm_isolation_pool_pending_pods": {"pool", "class"},
    "rocm_isolation_pool_oldest_pending_seconds": {"pool", "class"},
    # Device-level reservation: the split nodes' GPUs (pool: reserved or shared side of the split).
    "rocm_isolation_pool_split_devices": {"pool"},
    "rocm_isolation_pool_split_devices_allocated": {"pool", "class"},
    # The GPUs' own word (issue 48: serve --audit-gpu-metrics).
    "rocm_isolation_audit_gpu_metrics_read": set(),
    "rocm_isolation_reserved_gpu_activity_percent": {"node", "gpu", "inference"},
}
# Not ours: Prometheus's own per-target series, and the kube-apiserver's fail-open counter.
EXTERNAL_METRICS = {"up": {"job"}, "apiserver_admission_webhook_fail_open_count": {"name", "type"}}
# Labels the Prometheus Operator adds to every series scraped through a ServiceMonitor.
TARGET_LABELS = {"job", "namespace", "pod", "instance", "service", "endpoint", "container"}


# --- helpers --------------------------------------------------------------------------------------


_CA = certs.generate_ca().cert_pem()


def monitoring_objects(overlay: str = "cert-manager", **kwargs: Any) -> list[dict[str, Any]]:
    ca = _CA if overlay == "self-signed" else None
    resources = render.render(overlay=overlay, ca_bundle=ca, monitoring=True, **kwargs)
    return [r for r in resources if r["kind"] in MONITORING_KINDS or r["metadata"]["name"] == dashboard.CONFIGMAP]


def find(resources: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name))


def rule_file(tmp_path: Path) -> Path:
    """The PrometheusRule's spec is a Prometheus rule file (groups: ...)."""
    rule = find(render.build(MONITORING), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False), encoding="utf-8")
    return path


def alerts() -> list[dict[str, Any]]:
    rule = find(render.build(MONITORING), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def panel_queries() -> list[str]:
    model = json.loads(dashboard.dashboard_json())
    return [target["expr"] for panel in model["panels"] for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: `make promtool` installs it (apt-get install prometheus)")
    return path


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", render.OVERLAYS)
def test_monitoring_adds_only_its_objects_to_either_certificate_overlay(overlay: str) -> None:
    ca = _CA if overlay == "self-signed" else None
    without = render.render(overlay=overlay, ca_bundle=ca)
    with_monitoring = render.render(overlay=overlay, ca_bundle=ca, monitoring=True)
    assert with_monitoring[: len(without)] == without
    added = with_monitoring[len(without) :]
    assert sorted((r["kind"], r["metadata"]["name"]) for r in added) == [
        ("ConfigMap", dashboard.CONFIGMAP),
        ("PrometheusRule", "rocm-isolation-webhook"),
        ("ServiceMonitor", "rocm-isolation-webhook"),
    ]
    assert all(r["metadata"]["namespace"] == render.NAMESPACE for r in added)
    assert not MONITORING_KINDS & {r["kind"] for r in without}, "monitoring is opt-in: no CRD needed without it"


@pytest.mark.parametrize("overlay", render.OVERLAYS)
def test_every_monitoring_object_validates_against_its_schema(overlay: str) -> None:
    for resource in monitoring_objects(overlay):
        if resource["apiVersion"] == "monitoring.coreos.com/v1":
            jsonschema.validate(resource, {**SCHEMA, "$ref": f"#/$defs/{resource['kind']}"})
        else:
            kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def test_the_crd_schemas_are_strict() -> None:
    """The schema check above can fail: misspelt or out-of-enum fields are rejected."""
    monitor = find(monitoring_objects(), "ServiceMonitor")
    bad_scheme = yaml.safe_load(yaml.safe_dump(monitor))
    bad_scheme["spec"]["endpoints"][0]["scheme"] = "HTTPS"
    misspelt = yaml.safe_load(yaml.safe_dump(monitor))
    misspelt["spec"]["endpoints"][0]["tlsconfig"] = misspelt["spec"]["endpoints"][0].pop("tlsConfig")
    rule = find(monitoring_objects(), "PrometheusRule")
    bad_for = yaml.safe_load(yaml.safe_dump(rule))
    bad_for["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    both = yaml.safe_load(yaml.safe_dump(rule))
    both["spec"]["groups"][0]["rules"][0]["record"] = "x"
    for resource in (bad_scheme, misspelt, bad_for, both):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(resource, {**SCHEMA, "$ref": f"#/$defs/{resource['kind']}"})


def test_the_servicemonitor_scrapes_the_webhook_over_verified_https() -> None:
    resources = render.render(overlay="cert-manager", monitoring=True)
    monitor = find(resources, "ServiceMonitor")
    service = find(resources, "Service", render.APP_NAME)
    deployment = find(resources, "Deployment", render.APP_NAME)
    certificate = find(resources, "Certificate", render.APP_NAME)
    [endpoint] = monitor["spec"]["endpoints"]
    # The Service's port, by the name the ServiceMonitor refers to, and the Service its selector picks.
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    tls = endpoint["tlsConfig"]
    assert "insecureSkipVerify" not in tls
    # Prometheus dials pod IPs: the name it verifies must be one the serving certificate carries.
    assert tls["serverName"] in certs.service_dns_names()
    assert tls["serverName"] in certificate["spec"]["dnsNames"]
    # The CA comes from the secret the pods serve from (cert-manager writes ca.crt into it).
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert tls["ca"]["secret"]["name"] == volumes["certs"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert tls["ca"]["secret"]["key"] == "ca.crt"


def test_runbook_base_url_makes_the_runbook_links_absolute() -> None:
    base = "https://git.example.com/org/rocm-isolation-webhook/blob/v0.1.0/"
    rule = find(monitoring_objects(runbook_base_url=base), "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(url.startswith(base + "docs/operations.md#") for url in urls)
    with pytest.raises(render.RenderError, match="--runbook-base-url is for the alerts of --monitoring"):
        render.render(runbook_base_url=base)


def test_manifests_monitoring_on_the_command_line() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "webhook", "manifests", *args]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    plain, monitored = run(), run("--monitoring")
    assert plain.returncode == monitored.returncode == 0, monitored.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(monitored.stdout) if doc]
    assert {"ServiceMonitor", "PrometheusRule"} <= set(kinds)
    assert "ServiceMonitor" not in plain.stdout
    assert monitored.stdout.startswith(f"# Rendered by rocm-isolation-webhook {render.__version__}: manifests ")
    assert "--monitoring" in monitored.stdout.splitlines()[0]
    refused = run("--runbook-base-url", "https://x.example")
    assert refused.returncode == 2
    assert "--runbook-base-url is for the alerts of --monitoring" in refused.stderr


# --- kustomize ------------------------------------------------------------------------------------


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not found: the comparison with real kustomize needs `kubectl kustomize`")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def identity(resource: dict[str, Any]) -> tuple[str, str, str, str]:
    metadata = resource["metadata"]
    return (resource["apiVersion"], resource["kind"], metadata.get("namespace", ""), metadata["name"])


def test_kubectl_kustomize_builds_the_monitoring_overlay_with_a_certificate_overlay(tmp_path: Path) -> None:
    """What the README tells kustomize users to write: their own kustomization listing a certificate overlay
    and the monitoring one. Real kustomize builds it into exactly what `manifests --monitoring` renders."""
    overlays = ROOT / "manifests" / "overlays"
    # kustomize takes relative paths only.
    resources = [os.path.relpath(overlays / name, tmp_path) for name in ("cert-manager", "monitoring")]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": resources}), encoding="utf-8")
    built = sorted(kustomize(tmp_path), key=identity)
    rendered = render.render(overlay="cert-manager", monitoring=True, image="rocm-isolation-webhook:0.1.0")
    assert built == sorted(rendered, key=identity)
    assert sorted(kustomize(MONITORING), key=identity) == sorted(render.build(MONITORING), key=identity)


# --- alert rules ----------------------------------------------------------------------------------


def test_the_alert_rules_pass_promtool_check(promtool: str, tmp_path: Path) -> None:
    out = subprocess.run([promtool, "check", "rules", str(rule_file(tmp_path))], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_the_alert_rules_pass_their_unit_tests(promtool: str, tmp_path: Path) -> None:
    rule_file(tmp_path)
    tests = tmp_path / "alerts-test.yaml"
    shutil.copy(FIXTURES / "monitoring" / "alerts-test.yaml", tests)
    out = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_can_fail(promtool: str, tmp_path: Path) -> None:
    """The unit tests above are not vacuous: with one threshold changed, promtool reports the failure."""
    path = rule_file(tmp_path)
    path.write_text(path.read_text(encoding="utf-8").replace("> 600", "> 6000"), encoding="utf-8")
    shutil.copy(FIXTURES / "monitoring" / "alerts-test.yaml", tmp_path / "alerts-test.yaml")
    out = subprocess.run([promtool, "test", "rules", "alerts-test.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0
    assert "RocmIsolationInferencePodsPending" in out.stdout + out.stderr


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    cases = yaml.safe_load((FIXTURES / "monitoring" / "alerts-test.yaml").read_text(encoding="utf-8"))
    fired: set[str] = set()
    silent: set[str] = set()
    for test in cases["tests"]:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts no unit test makes fire"
    assert names - silent == set(), "alerts no unit test keeps silent"


def operations_anchors() -> set[str]:
    """GitHub's heading anchors of docs/operations.md (lower case, punctuation dropped, spaces to -)."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_severity_summary_description_and_a_runbook() -> None:
    anchors = operations_anchors()
    for alert in alerts():
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], alert["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md", alert["alert"]
        assert anchor in anchors, f"{alert['alert']}: docs/operations.md has no section #{anchor}"
        assert anchor == alert["alert"].lower(), "one runbook section per alert, named after it"


# --- metric names ---------------------------------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """The series selectors of a PromQL expression: (metric name, label names matched). Functions and
    aggregations are names followed by "(", grouping clauses' label lists and range durations are not
    selectors, strings and numbers are skipped."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]|\boffset\s+\w+", " ", expr)
    out = []
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", expr):
        name, matchers, call = match.groups()
        if call or name in _KEYWORDS or name.startswith("__"):
            continue
        if re.fullmatch(r"\d+(\.\d+)?(e\d+)?", name) or name in {"Inf", "NaN"}:
            continue
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        out.append((name, labels))
    return out


def exported_metrics() -> dict[str, set[str]]:
    """Every series name the webhook's Metrics can export, with its label names."""
    out: dict[str, set[str]] = {}
    for collector in vars(metrics.Metrics()).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        labels = set(getattr(collector, "_labelnames", ()))  # prometheus-client keeps them private
        for family in collector.describe():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}[family.type]
            for suffix in suffixes:
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_the_selector_parser_finds_names_and_labels() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(rocm_isolation_x_bucket{kind="a b",pod!~"x"}[5m]))) '
        "> 1 and on () max(up) == 1 or absent(rocm_isolation_y offset 5m)"
    )
    assert selectors(expr) == [("rocm_isolation_x_bucket", {"kind", "pod"}), ("up", set()), ("rocm_isolation_y", set())]


def test_the_audit_gauges_match_the_fixed_names_once_exported() -> None:
    """The alerts and panels rely on the audit gauges' names and labels fixed in issue 12; once
    webhook/service/metrics.py exports them, they must be exactly those."""
    exported = exported_metrics()
    for name, labels in AUDIT_METRICS.items():
        if name in exported:
            assert exported[name] == labels, name


def test_every_metric_an_alert_or_panel_reads_exists() -> None:
    known = {**AUDIT_METRICS, **EXTERNAL_METRICS, **exported_metrics()}
    assert "rocm_isolation_admission_review_duration_seconds_bucket" in known
    assert "rocm_isolation_errors_total" in known
    expressions = [str(a["expr"]) for a in alerts()] + panel_queries()
    used = set()
    for expr in expressions:
        for name, labels in selectors(expr):
            assert name in known, f"{name} in {expr!r} is exported by nothing"
            assert labels <= known[name] | TARGET_LABELS, f"{name} has no label {labels - known[name]}: {expr!r}"
            used.add(name)
    # What the dashboard and the alerts are for (issue 12), each read at least once.
    assert {
        "rocm_isolation_admission_reviews_total",
        "rocm_isolation_admission_review_duration_seconds_bucket",
        "rocm_isolation_denials_total",
        "rocm_isolation_errors_total",
        "rocm_isolation_certificate_expiry_timestamp_seconds",
        "rocm_isolation_policy_last_reload_success",
        "rocm_isolation_cluster_cache_synced",
        "rocm_isolation_audit_findings",
        "rocm_isolation_audit_last_success_timestamp_seconds",
        "rocm_isolation_audit_leader",
        "rocm_isolation_pool_gpus_allocatable",
        "rocm_isolation_pool_gpus_requested",
        "rocm_isolation_pool_pending_pods",
        "rocm_isolation_pool_oldest_pending_seconds",
        "rocm_isolation_pool_split_devices",
        "rocm_isolation_pool_split_devices_allocated",
        # issue 43: the demand against the reservation (pool recommend reads the same gauges)
        "rocm_isolation_reserved_gpus",
        "rocm_isolation_reserved_gpus_inference",
        "rocm_isolation_reserved_gpus_inference_waiting",
        "rocm_isolation_reserved_gpus_lent",
        "rocm_isolation_reserved_gpus_idle",
        # issue 48: the GPUs' own word (the reserved GPUs' activity; the exporter read)
        "rocm_isolation_reserved_gpu_activity_percent",
        "rocm_isolation_audit_gpu_metrics_read",
        "up",
    } <= used


def test_a_misspelt_metric_would_be_caught() -> None:
    known = {**AUDIT_METRICS, **EXTERNAL_METRICS, **exported_metrics()}
    [(name, _)] = selectors("sum(rate(rocm_isolation_eror_total[5m]))")
    assert name not in known


# --- dashboard ------------------------------------------------------------------------------------


def test_the_dashboard_configmap_is_what_the_generator_writes() -> None:
    committed = (MONITORING / dashboard.GENERATED_FILE).read_text(encoding="utf-8")
    assert committed == dashboard.configmap_text(), (
        f"{dashboard.GENERATED_FILE} is stale: run `.venv/bin/python -m webhook.deploy.dashboard`"
    )


def test_the_dashboard_configmap_is_picked_up_by_grafanas_sidecar() -> None:
    configmap = find(monitoring_objects(), "ConfigMap", dashboard.CONFIGMAP)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(key, text)] = configmap["data"].items()
    assert key.endswith(".json")
    model = json.loads(text)
    assert model["uid"] == dashboard.UID and model["title"] == dashboard.TITLE
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in model["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
    # 1 MiB is the apiserver's limit for a ConfigMap; the sidecar reads the whole object.
    assert len(text.encode()) < 1024 * 1024


def test_the_dashboard_queries_are_valid_promql(promtool: str) -> None:
    """promtool parses each panel query (as the expression of a throwaway recording rule)."""
    queries = [q.replace("$__rate_interval", "5m") for q in panel_queries()]
    rules = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": q} for i, q in enumerate(queries)]}]
    }
    out = subprocess.run(
        [promtool, "check", "rules", "/dev/stdin"], input=yaml.safe_dump(rules), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- a real Prometheus scraping the real webhook ---------------------------------------------------


def prometheus_config(monitor: dict[str, Any], *, port: int, ca_file: Path, rules: Path) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates from the ServiceMonitor's endpoint (scheme, path,
    tlsConfig with the CA read from the secret's ca.crt), pointed at the loopback server instead of the
    Service's endpoints; a second job verifies against a name the certificate lacks (must fail)."""
    [endpoint] = monitor["spec"]["endpoints"]
    tls = endpoint["tlsConfig"]

    def job(name: str, server_name: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": endpoint["scheme"],
            "metrics_path": endpoint["path"],
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "tls_config": {"ca_file": str(ca_file), "server_name": server_name},
            "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": render.NAMESPACE, "pod": "webhook-a"}}
            ],
        }

    return {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [job(monitor["metadata"]["name"], tls["serverName"]), job("wrong-name", "wrong.example")],
    }


def prometheus_query(port: int, query: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_a_real_prometheus_scrapes_the_webhook_as_the_servicemonitor_says(tmp_path: Path) -> None:
    """The Debian prometheus package that brings promtool also brings the server: it scrapes a real
    `serve` over HTTPS with the ServiceMonitor's TLS settings and the CA a secret's ca.crt holds, loads
    the PrometheusRule, and evaluates every rule without error."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not found: `make promtool` installs it (apt-get install prometheus)")
    pki = make_pki(tmp_path / "certs")
    server = launch_server(tmp_path, cert_dir=pki.dir, ca_file=pki.ca_file)
    monitor = find(monitoring_objects(), "ServiceMonitor")
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(prometheus_config(monitor, port=server.port, ca_file=pki.ca_file, rules=rule_file(tmp_path))),
        encoding="utf-8",
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def up(job: str) -> float | None:
            result = prometheus_query(web, f'up{{job="{job}"}}')
            return float(result[0]["value"][1]) if result else None

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/-/ready", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        wait_for(ready, timeout=60, what="prometheus ready")
        wait_for(lambda: up("rocm-isolation-webhook") == 1.0, timeout=60, what="the webhook scraped (up == 1)")
        wait_for(lambda: up("wrong-name") == 0.0, timeout=60, what="the wrong server name refused (up == 0)")
        # The series the alerts read are there from the first scrape, the first internal error's counter included.
        [errors] = prometheus_query(web, 'rocm_isolation_errors_total{kind="internal"}')
        assert errors["metric"]["namespace"] == render.NAMESPACE and errors["value"][1] == "0"
        [expiry] = prometheus_query(web, "rocm_isolation_certificate_expiry_timestamp_seconds")
        assert float(expiry["value"][1]) == pki.serving.cert.not_valid_after_utc.timestamp()
        assert prometheus_query(web, "rocm_isolation_admission_review_duration_seconds_bucket")

        def evaluated() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/rules", timeout=5) as reply:
                groups = json.loads(reply.read())["data"]["groups"]
            return [rule for group in groups for rule in group["rules"]]

        wait_for(lambda: all(r["health"] != "unknown" for r in evaluated()), timeout=60, what="rules evaluated")
        rules = evaluated()
        assert len(rules) == len(alerts())
        assert [(r["name"], r["health"]) for r in rules if r["health"] != "ok"] == []
        # Reachable and healthy: the webhook's own alerts go quiet (Down was pending before the first scrape).
        quiet = {"RocmIsolationWebhookDown", "RocmIsolationWebhookErrors", "RocmIsolationCertificateExpiring"}
        wait_for(
            lambda: all(r["state"] == "inactive" for r in evaluated() if r["name"] in quiet),
            timeout=60,
            what=f"{quiet} inactive",
        )
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        server.stop()


# --- the exporter's scrape (overlays/gpu-metrics) ---------------------------------------------------

# The GPU Operator's metrics exporter pods and port (ROCm/gpu-operator internal/metricsexporter/metricsexporter.go:
# the DaemonSet's pod labels, its container port name; "default" is the DeviceConfig's name).
EXPORTER_POD_LABELS = {"app.kubernetes.io/name": "metrics-exporter", "daemonset-name": "default"}
EXPORTER_PORT_NAME = "exporter-port"


def test_the_gpu_metrics_overlay_scrapes_the_operators_exporter_pods_keeping_their_pod_labels() -> None:
    [monitor] = kustomize(ROOT / "manifests" / "overlays" / "gpu-metrics")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= EXPORTER_POD_LABELS.items(), "the selector must match the operator's exporter pods"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["kube-amd-gpu"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # By the port's name: a DeviceConfig's spec.metricsExporter.port changes the number, not the name.
    assert (endpoint["port"], endpoint["path"]) == (EXPORTER_PORT_NAME, "/metrics")
    # The exporter's pod/namespace labels name the pod the kubelet allocated the GPU to: kept as they are.
    assert endpoint["honorLabels"] is True
