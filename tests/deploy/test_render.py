"""``rocm-isolation-webhook manifests``: the project's dry-run validation of its manifests.

Every rendered object of every overlay validates strictly against the Kubernetes 1.37 schema
(cert-manager's objects against tests/fixtures/schemas/cert-manager.io-v1.yaml), rendering is
deterministic, the inputs land where they must, and the manifests ship inside the wheel.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from webhook import __version__, cli
from webhook.core.policy import default_policy, default_policy_text
from webhook.deploy import render
from webhook.service import certs

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"
K8S_VERSION = "1.37.0"
CERT_MANAGER_SCHEMA = yaml.safe_load((FIXTURES / "schemas" / "cert-manager.io-v1.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    certs.write_certificates(out, dns_names=certs.service_dns_names())
    return out / certs.CA_CERT


def render_overlay(overlay: str, ca_file: Path, **kwargs: Any) -> list[dict[str, Any]]:
    ca = render.read_ca_bundle(ca_file) if overlay == "self-signed" else None
    return render.render(overlay=overlay, ca_bundle=ca, **kwargs)


def find(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)


def validate(resource: dict[str, Any]) -> None:
    if resource["apiVersion"].startswith("cert-manager.io/"):
        schema = {**CERT_MANAGER_SCHEMA, "$ref": f"#/$defs/{resource['kind']}"}
        jsonschema.validate(resource, schema)
    else:
        kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # No kubeconfig: the manifests of 1.36, not those of whatever cluster the machine's kubeconfig names.
    return subprocess.run(
        [sys.executable, "-m", "webhook", "manifests", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig"},
    )


# --- schema and determinism -----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", render.OVERLAYS)
def test_every_rendered_object_validates_strictly(overlay: str, ca_file: Path) -> None:
    resources = render_overlay(overlay, ca_file)
    kinds = {r["kind"] for r in resources}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    } <= kinds
    if overlay == "cert-manager":
        assert {"Issuer", "Certificate"} <= kinds
    for resource in resources:
        validate(resource)
    names = [(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]) for r in resources]
    assert len(names) == len(set(names)), "no object may be rendered twice"


def test_the_validation_is_strict() -> None:
    """The checks above can fail: a misspelt field is rejected by both validators."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"port": 443}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(service)
    issuer = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": "x", "namespace": "y"},
        "spec": {"selfsigned": {}},
    }
    with pytest.raises(jsonschema.ValidationError):
        validate(issuer)


@pytest.mark.parametrize("overlay", render.OVERLAYS)
def test_rendering_is_deterministic(overlay: str, ca_file: Path) -> None:
    args = ["--overlay", overlay] + (["--ca-bundle", str(ca_file)] if overlay == "self-signed" else [])
    first, second = run_cli(*args), run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert render.dump(render_overlay(overlay, ca_file)) in first.stdout
    parsed = [doc for doc in yaml.safe_load_all(first.stdout) if doc]
    assert parsed == render_overlay(overlay, ca_file), "the YAML printed is the objects rendered"


def test_the_base_is_the_default_policy_rendering() -> None:
    """manifests/ stays buildable by plain kustomize with the same result: its generated files are
    exactly what the renderer writes for the default policy."""
    expected = render.generated_base_files(default_policy(), default_policy_text())
    for name, text in expected.items():
        actual = (ROOT / "manifests" / "base" / name).read_text(encoding="utf-8")
        assert actual == text, f"manifests/base/{name} is stale: run webhook.deploy.render.write_generated_base()"
    raw = render.build(ROOT / "manifests" / "overlays" / "cert-manager")
    applied = render.render(overlay="cert-manager", image="rocm-isolation-webhook:0.1.0")
    assert raw == applied


@pytest.mark.parametrize("overlay", [*render.OVERLAYS, render.MONITORING_OVERLAY])
def test_real_kustomize_builds_what_the_built_in_subset_builds(overlay: str) -> None:
    """The hand-written kustomize subset is only kept because it agrees with real kustomize
    (`kubectl kustomize`) on every overlay shipped; it caught kustomize rewriting a folded YAML block."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not found: comparing with real kustomize needs `kubectl kustomize`")
    directory = ROOT / "manifests" / "overlays" / overlay
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr

    def identity(resource: dict[str, Any]) -> tuple[str, str, str, str]:
        metadata = resource["metadata"]
        return (resource["apiVersion"], resource["kind"], metadata.get("namespace", ""), metadata["name"])

    built = sorted((doc for doc in yaml.safe_load_all(out.stdout) if doc), key=identity)
    assert built == sorted(render.build(directory), key=identity)


def test_the_kustomize_subset_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [a.yaml]\nnamePrefix: x-\n")
    with pytest.raises(render.RenderError, match="namePrefix not supported"):
        render.build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [a.yaml]\npatches: [{path: p.yaml, target: {kind: ConfigMap, name: nope}}]\n"
    )
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tmp_path / "p.yaml").write_text("- {op: add, path: /data, value: {}}\n")
    with pytest.raises(render.RenderError, match="matches no resource"):
        render.build(tmp_path)


# --- inputs ---------------------------------------------------------------------------------------


def test_self_signed_ca_bundle_is_the_ca(ca_file: Path) -> None:
    resources = render_overlay("self-signed", ca_file)
    hook = find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_file.read_bytes()
    assert (
        "annotations" not in find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)["metadata"]
    )


def test_cert_manager_injects_the_ca_of_the_serving_certificate(ca_file: Path) -> None:
    resources = render_overlay("cert-manager", ca_file)
    configuration = find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)
    target = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = target.split("/")
    certificate = find(resources, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace == render.NAMESPACE
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    # The Deployment mounts the secret cert-manager writes, and the names cover the Service.
    deployment = find(resources, "Deployment", render.APP_NAME)
    secrets = [v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert certificate["spec"]["secretName"] in secrets
    service = configuration["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    # Issued by a CA Issuer whose CA is itself a Certificate: renewing the leaf keeps the caBundle.
    issuer = find(resources, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = next(
        r
        for r in resources
        if r["kind"] == "Certificate" and r["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
    )
    assert ca["spec"]["isCA"] is True


def test_self_signed_requires_a_ca_certificate(ca_file: Path, tmp_path: Path) -> None:
    missing = run_cli("--overlay", "self-signed")
    assert missing.returncode == 2 and "--ca-bundle" in missing.stderr
    leaf = ca_file.parent / certs.TLS_CERT
    wrong = run_cli("--overlay", "self-signed", "--ca-bundle", str(leaf))
    assert wrong.returncode == 2 and "not a CA certificate" in wrong.stderr
    garbage = tmp_path / "x.pem"
    garbage.write_text("hello")
    assert "not a PEM certificate" in run_cli("--overlay", "self-signed", "--ca-bundle", str(garbage)).stderr
    assert run_cli("--ca-bundle", str(ca_file)).returncode == 2, "cert-manager's cainjector owns the caBundle"


def test_policy_file_lands_in_the_configmap_and_the_cel(tmp_path: Path) -> None:
    text = (FIXTURES / "policies" / "engine-all-pods.yaml").read_text(encoding="utf-8")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(text)
    result = run_cli("--policy", str(policy_file), "--image", "registry.example/rocm-isolation-webhook:9.9")
    assert result.returncode == 0, result.stderr
    resources = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert find(resources, "ConfigMap", render.POLICY_CONFIGMAP)["data"][render.POLICY_KEY] == text
    hook = find(resources, "MutatingWebhookConfiguration", render.WEBHOOK_CONFIGURATION)["webhooks"][0]
    assert "gpu-pods" not in [c["name"] for c in hook["matchConditions"]], "allPods: every pod goes to the webhook"
    container = find(resources, "Deployment", render.APP_NAME)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/rocm-isolation-webhook:9.9"


def test_invalid_policy_is_reported_with_its_path(tmp_path: Path) -> None:
    policy_file = tmp_path / "bad.yaml"
    policy_file.write_text("apiVersion: rocm-isolation.io/v1alpha1\nkind: IsolationPolicy\nspec: {classes: {}}\n")
    result = run_cli("--policy", str(policy_file))
    assert result.returncode == 2
    assert str(policy_file) in result.stderr and result.stdout == ""


def test_policy_without_a_taint_is_warned(tmp_path: Path) -> None:
    text = default_policy_text().replace(
        "    taint:\n      key: rocm-isolation.io/reserved\n      value: inference\n      effect: NoSchedule\n", ""
    )
    assert "taint" not in yaml.safe_load(text)["spec"]["reservedNodes"]
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(text)
    result = run_cli("--policy", str(policy_file))
    assert result.returncode == 0 and "sets no reservedNodes.taint" in result.stderr


def test_mode_bindings_follow_the_policy_mode() -> None:
    for mode in render.MODES:
        text = default_policy_text().replace("  mode: enforce\n", f"  mode: {mode}\n")
        resources = render.render(policy_text=text)
        for binding_mode in render.MODES:
            binding = find(
                resources, "ValidatingAdmissionPolicyBinding", f"{render.RESERVED_NODES_POLICY}-{binding_mode}"
            )
            mode_expression = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][1]
            # Namespaces without a (valid) mode label get the policy's mode.
            assert (mode_expression["operator"] == "NotIn") == (binding_mode == mode)
        audit = find(resources, "ValidatingAdmissionPolicyBinding", f"{render.RESERVED_NODES_POLICY}-audit")
        assert "Deny" not in audit["spec"]["validationActions"], "audit mode never denies"


# --- the Deployment runs what the image and the serve command provide ----------------------------


def test_deployment_args_are_accepted_by_serve() -> None:
    container = find(render.render(), "Deployment", render.APP_NAME)["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    parsed = cli.build_parser(args).parse_args(args)
    assert parsed.command == "serve"
    assert parsed.cert_dir == "/certs"
    assert parsed.policy == f"/etc/rocm-isolation/{render.POLICY_KEY}"
    assert parsed.port == container["ports"][0]["containerPort"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/certs"] == "certs" and mounts["/etc/rocm-isolation"] == "policy"


def test_dockerfile_runs_the_console_script_as_the_deployments_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.split(None, 1) for line in dockerfile.splitlines() if line and not line.startswith((" ", "#"))]
    final_stage = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    user = [arg for op, arg in final_stage if op == "USER"]
    entrypoint = [arg for op, arg in final_stage if op == "ENTRYPOINT"]
    assert user == ["10001:10001"]
    assert entrypoint == ['["rocm-isolation-webhook"]']
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'rocm-isolation-webhook = "webhook.cli:main"' in pyproject
    pod = find(render.render(), "Deployment", render.APP_NAME)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsGroup"] == 10001
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 10001
    cmd = next(arg for op, arg in final_stage if op == "CMD")
    assert yaml.safe_load(cmd) == pod["containers"][0]["args"][:4], "the image's default command is the Deployment's"
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignored and "!certs/" not in ignored, "private keys never enter the build context"


def test_default_image_is_this_version() -> None:
    container = find(render.render(), "Deployment", render.APP_NAME)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"rocm-isolation-webhook:{__version__}"


# --- packaging ------------------------------------------------------------------------------------


def test_manifests_ship_in_the_wheel_and_render_from_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "webhook", source / "webhook", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "manifests", source / "manifests")
    (source / "README.md").write_text("readme\n")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    expected = {
        f"webhook/_manifests/{path.relative_to(ROOT / 'manifests')}" for path in (ROOT / "manifests").rglob("*.yaml")
    }
    assert expected <= names
    installed = subprocess.run(
        [sys.executable, "-c", "import sys; from webhook.cli import main; sys.exit(main(['manifests']))"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == run_cli().stdout


def test_the_manifests_subcommand_renders_for_the_cluster_it_targets() -> None:
    """``ops/manifests.main``: reads the cluster (or --kubernetes-version), then ``render.main``."""
    from webhook.ops import manifests

    parser = cli.build_parser(["manifests"])
    args = parser.parse_args(["manifests", "--overlay", "cert-manager", "--kubernetes-version", "1.35"])
    assert isinstance(args, argparse.Namespace) and args.handler is manifests.main
    assert args.kubernetes_version == "1.35" and args.kubeconfig is None
