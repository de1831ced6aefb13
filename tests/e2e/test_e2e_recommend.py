"""``pool recommend`` against a real Prometheus (issue 43): Debian's ``prometheus`` package, its history backfilled
the documented way (``promtool tsdb create-blocks-from openmetrics``) with a day of the demand gauges ending now
(the shapes of tests/fixtures/recommend/generate.py: the unit tests' answers are known), served over TLS with
the certificates ``rocm-isolation-webhook certs`` makes.

- The same history read from Prometheus (``--prometheus``, ``--certificate-authority``) and from the file it was
  backfilled from (``--from-file``) gives the same recommendation: the PromQL (``max by (pool, nodes)``, its
  lookback) and the file's lookup agree; so does what ``--save`` wrote, read back. So does how busy the reserved GPUs
  were (issue 48: the background audit's activity gauge, backfilled beside the demand).
- TLS without the CA is refused with a clear error; a window longer than the history gets "too short a history";
  both exit 2 with no recommendation.

Without prometheus/promtool the module is skipped with a notice saying how to get them; ``.ci/run`` installs them
(``make promtool``) and sets ``E2E_REQUIRE_PROMETHEUS=1``, which turns that skip into a failure: in CI it runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .controlplane import ASSETS_ENV, LOOPBACK, ProcessGroup, free_port, loopback_only, missing_binaries
from .harness import REPO, cli

REQUIRE_ENV = "E2E_REQUIRE_PROMETHEUS"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
NOTICE = (
    "prometheus/promtool not found: pool recommend against a real Prometheus did not run. Install Debian's "
    "package (`make promtool`, or `apt-get install prometheus`; .ci/run does it when running as root)"
)
# Without the control plane's binaries conftest.py deselects the whole e2e suite and says so: no notice here.
missing = PROMETHEUS is None or PROMTOOL is None
if missing and not os.environ.get(REQUIRE_ENV) and not missing_binaries(os.environ.get(ASSETS_ENV)):
    pytest.skip(NOTICE, allow_module_level=True)

SHAPES = REPO / "tests" / "fixtures" / "recommend" / "generate.py"
DAY = 86400
STEP = 60  # a sample a minute, as a 1 m scrape interval gives


def shapes() -> Any:
    spec = importlib.util.spec_from_file_location("recommend_shapes", SHAPES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Server:
    url: str
    ca_file: Path
    history: Path


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.fail(f"{NOTICE}; {REQUIRE_ENV} is set: in CI this test must run", pytrace=False)
    loopback_only()
    directory = tmp_path_factory.mktemp("prometheus")
    module = shapes()
    # A day and 10 minutes of history up to the last whole minute: the day is shifted so that the fixture's 00:00
    # falls on today's 00:00 UTC (the busiest hours are the fixture's, whatever the time of the run).
    end = int(time.time()) // STEP * STEP - STEP
    module.START = end - end % DAY - DAY  # generate.py's hours count from START
    stamps = range(end - DAY - 600, end + 1, STEP)
    history = directory / "demand.om"
    demand = module.history({"whole": module.whole, "split": module.split}, stamps)
    history.write_text(demand.removesuffix("# EOF\n") + activity(stamps) + "# EOF\n", encoding="utf-8")
    data = directory / "data"
    backfill = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    certs = directory / "certs"
    cli("certs", "--out-dir", str(certs), check=True)  # 127.0.0.1 among its names
    web = directory / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs / 'tls.crt'}\n  key_file: {certs / 'tls.key'}\n")
    config = directory / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    port = free_port()
    processes = ProcessGroup(directory)
    component = processes.start(
        "prometheus",
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address={LOOPBACK}:{port}",
            f"--web.config.file={web}",
        ],
    )
    url = f"https://{LOOPBACK}:{port}"
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", context=context, timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if component.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not become ready:\n{component.tail()}")
            time.sleep(0.5)
        yield Server(url, certs / "ca.crt", history)
    finally:
        processes.stop_all()


ACTIVITY = "rocm_isolation_reserved_gpu_activity_percent"


def activity(stamps: range) -> str:
    """The background audit's gauge of two reserved GPUs (issue 48): one held by inference at 30 %, one unheld and
    idle; whatever the grid, the mean is 15 %, the p95 30 %, inference's both 30 %."""
    lines = [f"# TYPE {ACTIVITY} gauge"]
    for gpu, inference, value in (("gpu_id 0 (serial S0)", "true", 30), ("gpu_id 1 (serial S1)", "false", 0)):
        series = f'{ACTIVITY}{{pod="webhook-0",node="r1",gpu="{gpu}",inference="{inference}"}}'
        lines += [f"{series} {value} {at}" for at in stamps]
    return "\n".join(lines) + "\n"


def busy(document: dict[str, Any]) -> tuple[Any, ...]:
    found = document["reservedGpuActivity"]
    return (found["read"], found["reserved"], found["inference"])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("pool", "recommend", *args, timeout=300)


def figures(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a recommendation says, without the sample counts (the two grids end a few minutes apart)."""
    return [
        (p["nodes"], p["today"], p["recommended"], p["demandGPUs"], p["burstGPUs"], p["peakHour"], p["commands"])
        for p in document["pools"]
    ]


def test_recommend_reads_the_same_answer_from_prometheus_and_from_the_file(prometheus: Server) -> None:
    started = time.monotonic()
    live = run("--prometheus", prometheus.url, "--certificate-authority", str(prometheus.ca_file), "--window", "1d",
               "-o", "json")  # fmt: skip
    seconds = time.monotonic() - started
    assert live.returncode == 0, live.stdout + live.stderr
    offline = run("--from-file", str(prometheus.history), "--window", "1d", "-o", "json")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    found = json.loads(live.stdout)
    assert figures(found) == figures(json.loads(offline.stdout))
    # What --save writes is what was read: offline again from it, the same recommendation.
    saved = prometheus.history.with_name("saved.om.gz")
    kept = run("--prometheus", prometheus.url, "--certificate-authority", str(prometheus.ca_file), "--window", "1d",
               "--save", str(saved), "-o", "json")  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    again = run("--from-file", str(saved), "--window", "1d", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert figures(json.loads(again.stdout)) == figures(found)
    # How busy the reserved GPUs were (the activity gauge): the same from Prometheus, the file and what --save wrote.
    expected = (
        True,
        {"gpus": 2, "meanPercent": 15.0, "p95Percent": 30.0},
        {"gpus": 1, "meanPercent": 30.0, "p95Percent": 30.0},
    )
    assert busy(found) == busy(json.loads(offline.stdout)) == busy(json.loads(again.stdout)) == expected
    # The fixture's day (tests/ops/recommend/test_recommend.py reasons it out): whole 4 nodes -> 2, split 2 per node -> 3.
    assert [(p["nodes"], p["recommended"]) for p in found["pools"]] == [
        ("whole", {"reservedGPUs": 8, "reservedNodes": 2}),
        ("split", {"reservedGPUs": 12, "devicesPerNode": 3}),
    ]
    assert found["policyChange"] == "spec.lending.headroomGPUs: 4"
    assert seconds < 60, f"7 range queries of a day took {seconds:.1f} s"


def test_tls_without_the_ca_and_a_window_past_the_history_are_refused(prometheus: Server) -> None:
    untrusted = run("--prometheus", prometheus.url, "--window", "1d")
    assert untrusted.returncode == 2 and untrusted.stdout == ""
    assert "TLS" in untrusted.stderr and "--certificate-authority FILE" in untrusted.stderr
    longer = run("--prometheus", prometheus.url, "--certificate-authority", str(prometheus.ca_file), "--window", "3d")
    assert longer.returncode == 2 and longer.stdout == ""
    assert "too short a history for the window" in longer.stderr and "no recommendation" in longer.stderr
