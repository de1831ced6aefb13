"""The text exposition format read (webhook/ops/gpus/exposition.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from webhook.ops.gpus.exposition import ExpositionError, parse

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gpus"


def test_a_real_scrape_reads_every_label_and_takes_now_for_a_sample_without_timestamp() -> None:
    samples = list(parse((FIXTURES / "kaiwo-mi300x.prom").read_text(), 1000.0))
    assert [(s.name, s.labels["gpu_id"], s.labels["pod"], s.value, s.timestamp) for s in samples] == [
        ("gpu_gfx_activity", "0", "high-utilization-57ls6", 100.0, 1000.0),
        ("gpu_gfx_activity", "2", "", 0.0, 1000.0),
    ]
    assert samples[0].labels["card_series"] == "AMD Instinct MI300X OAM"
    assert samples[1].labels["cluster_name"] == ""


def test_timestamps_are_milliseconds_and_escapes_and_specials_are_decoded() -> None:
    text = 'm{a="x\\"y\\\\z\\n", b = "2" ,} +Inf 1500\nm NaN\n# comment\n\nm{} -1.5e3 2000\n'
    samples = list(parse(text, 7.0))
    assert samples[0].labels == {"a": 'x"y\\z\n', "b": "2"}
    assert (samples[0].value, samples[0].timestamp) == (math.inf, 1.5)
    assert math.isnan(samples[1].value) and samples[1].timestamp == 7.0
    assert (samples[2].value, samples[2].timestamp) == (-1500.0, 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('m{a="x} 1', "line 1: unterminated label value of a"),
        ("m{a=x} 1", 'line 1: a label name and =" expected'),
        ("ok 1\nm 1 2 3", "line 2: a value and an optional timestamp expected"),
        ("m abc", "line 1: 'abc' is not a number"),
        ("m 1 1.5", "line 1: '1.5' is not a timestamp"),
        ('{a="b"} 1', "line 1: a metric name expected"),
        ('m{a="1" b="2"} 1', "line 1: , or } expected after the value of a"),
    ],
)
def test_what_is_not_the_format_names_its_line(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message.replace("(", r"\(")):
        list(parse(text, 0.0))
