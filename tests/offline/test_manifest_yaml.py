"""``webhook.offline.manifest_yaml``: manifests read as kubectl reads them, printed so that every reader agrees.

kubectl reads YAML with sigs.k8s.io/yaml's fork of go-yaml v2; ``go_scalar`` ports its resolver
(goyaml.v2/resolve.go). The output is read back here with that port, with PyYAML (YAML 1.1, the
same rules as libyaml from which go-yaml was ported) and with ruamel.yaml as YAML 1.2 and 1.1.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import tempfile
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.tag import Tag

from webhook.offline import dryrun, manifest_yaml
from webhook.offline.manifest_yaml import (
    BOOL,
    FLOAT,
    INT,
    MERGE,
    NULL,
    STR,
    ReadError,
    dump,
    dump_plain,
    go_scalar,
    load,
    load_go,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dryrun"
CLASS = "rocm-isolation.io/class"

# Strings some YAML reader takes for something else, and strings that are hard to write at all.
TRICKY = [
    *("y", "Y", "n", "N", "yes", "Yes", "NO", "on", "On", "OFF", "off", "true", "False", "TRUE"),
    *("~", "null", "Null", "NULL", "", " ", "<<", "="),
    *("0x1F", "-0x1", "0o17", "-0o17", "0b101", "-0b101", "0b+1", "017", "08", "0", "-0", "+1", "1_000", "1__0"),
    *("9223372036854775807", "9223372036854775808", "18446744073709551616", "0xFFFFFFFFFFFFFFFFFF"),
    *("1e-5", "1E3", "1e400", "-1e-400", "1.", ".5", "+.5", "._5", ".5_5", "1_0.5", "6.8523015e+5"),
    *(".inf", "-.Inf", "+.INF", ".nan", ".NaN", "Infinity", "NaN", "inf"),
    *("1:20", "-1:20:30.5", "190:20:30", "12:30"),
    *("2024-05-01", "2024-5-1", "2024-05-01T10:00:00Z", "2001-12-14 21:59:43.10 -5", "2001-12-14t21:59:43.10-05:00"),
    *("!important", "&anchor", "*alias", "- item", "-", "? key", "?", "key: value", ":", "a #b", "#c"),
    *(" leading", "trailing ", "multi\nline", "ends\n", "\n", "tab\there", "'single'", '"double"', "\\"),
    *("@at", "`tick", "%percent", "|", "|-", ">", "{a: 1}", "[1, 2]", "---", "...", "--- x", "a,b", "a: "),
    *("\u2028", "\x85", "\ufeff", "\x00", "\x7f", "\u00a0", "é", "日本語", "😀", "\r\n", "null ", "Yes\n"),
]
FRAGMENTS = [*TRICKY, "a", "1", ".", "_", "e", "x", ":", " ", "#", "-", "0", "+", "'", '"', "\n", "\t"]

tricky_strings = st.one_of(
    st.sampled_from(TRICKY),
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4).map("".join),
    st.from_regex(r"[-+]?(0[xXoObB])?[0-9a-fA-F_.:eE+-]{0,8}", fullmatch=True),
    st.text(max_size=12),
)


@pytest.fixture(params=["libyaml", "ruamel"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways ``load`` reads: libyaml (PyYAML's C extension, go-yaml's ancestor) and ruamel.yaml (without it)."""
    if request.param == "ruamel":
        monkeypatch.setattr(manifest_yaml, "_GoLibyamlLoader", None)
    elif manifest_yaml._GoLibyamlLoader is None:
        pytest.skip("PyYAML has no libyaml here")
    return str(request.param)


# --- the readers ------------------------------------------------------------------------------


def read_go(text: str) -> list[Any]:
    return [doc for doc in load_go(text) if doc is not None]


def read_pyyaml(text: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _ruamel(version: tuple[int, int]) -> Callable[[str], list[Any]]:
    def read(text: str) -> list[Any]:
        reader = YAML(typ="safe", pure=True)
        reader.version = version
        return [doc for doc in reader.load_all(text) if doc is not None]

    return read


READERS = {"go-yaml v2": read_go, "PyYAML": read_pyyaml, "ruamel 1.2": _ruamel((1, 2)), "ruamel 1.1": _ruamel((1, 1))}


def typed(value: Any) -> Any:
    """The value with every scalar's type beside it: True is not 1, 1 is not 1.0, a date is not a string."""
    if isinstance(value, dict):
        return {"map": sorted((repr(typed(k)), typed(v)) for k, v in value.items())}
    if isinstance(value, list):
        return ["seq", *map(typed, value)]
    return (type(value).__name__, "nan" if isinstance(value, float) and math.isnan(value) else value)


def assert_all_read(text: str, expected: list[Any], only: list[int] | None = None) -> None:
    """Every reader gets ``expected`` (go-yaml v2 all of it, the others the documents in ``only``)."""
    assert typed(read_go(text)) == typed(expected), f"go-yaml v2 reads it differently:\n{text}"
    for name, read in READERS.items():
        found = read(text)
        for index in range(len(expected)) if only is None else only:
            assert typed(found[index]) == typed(expected[index]), (
                f"{name} reads document {index + 1} differently:\n{text}"
            )


# --- go-yaml v2's resolver --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tag", "value"),
    [
        # resolveMapList: YAML 1.1 booleans in three spellings each, nulls, special floats
        ("y", BOOL, True),
        ("Yes", BOOL, True),
        ("ON", BOOL, True),
        ("n", BOOL, False),
        ("off", BOOL, False),
        ("FALSE", BOOL, False),
        ("~", NULL, None),
        ("", NULL, None),
        ("Null", NULL, None),
        (".inf", FLOAT, math.inf),
        ("-.Inf", FLOAT, -math.inf),
        ("+.INF", FLOAT, math.inf),
        ("<<", MERGE, "<<"),
        # strconv.ParseInt(s, 0, 64) after removing underscores: Go's prefixes and signs
        ("0x1F", INT, 31),
        ("-0x1", INT, -1),
        ("0o17", INT, 15),
        ("017", INT, 15),
        ("0b101", INT, 5),
        ("1_000", INT, 1000),
        ("+1", INT, 1),
        ("-_1", INT, -1),
        ("9223372036854775807", INT, 2**63 - 1),
        ("18446744073709551615", INT, 2**64 - 1),  # ParseUint
        ("0xFFFFFFFFFFFFFFFFFF", INT, 2**72 - 1),  # math/big
        ("0b+1", INT, 1),  # the "0b" branch: ParseInt("+1", 2)
        # yamlStyleFloat, then ParseFloat
        ("1e-5", FLOAT, 1e-5),
        ("1E3", FLOAT, 1000.0),
        ("1.", FLOAT, 1.0),
        ("+.5", FLOAT, 0.5),
        ("08", FLOAT, 8.0),  # not an octal, but a YAML-style float
        ("18446744073709551616", FLOAT, 2.0**64),
        ("-9223372036854775809", FLOAT, -(2.0**63)),
        (".5_5", FLOAT, 0.55),  # '.' hint: ParseFloat keeps underscores between digits
        # strings
        ("1e400", STR, "1e400"),  # ParseFloat: out of range
        ("._5", STR, "._5"),
        ("1:20", STR, "1:20"),  # no base 60 in go-yaml
        ("2024-05-01", STR, "2024-05-01"),  # a timestamp decoded into interface{} stays a string
        ("2024-05-01T10:00:00Z", STR, "2024-05-01T10:00:00Z"),
        (".nan_", STR, ".nan_"),
        ("Infinity", STR, "Infinity"),
        ("NaN", STR, "NaN"),
        ("0x", STR, "0x"),
        ("-", STR, "-"),
        ("=", STR, "="),
        ("yes!", STR, "yes!"),
    ],
)
def test_go_scalar_follows_go_yaml_v2(text: str, tag: str, value: Any) -> None:
    found_tag, found = go_scalar(text)

    assert found_tag == tag
    assert typed(found) == typed(value)


def test_input_is_read_as_kubectl_reads_it(parser: str) -> None:
    text = "a: y\nb: 0o17\nc: 1_000\nd: 1:20\ne: 2024-05-01\nf: 'y'\ng: !!str 12\nh: |\n  x\nyes: on\n"

    (body,) = [found.body for found in load(text)]

    assert typed(body) == typed(
        {"a": True, "b": 15, "c": 1000, "d": "1:20", "e": "2024-05-01", "f": "y", "g": "12", "h": "x\n", True: True}
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\n---\nb: 1\nb: 2\n", r"document 2: not valid YAML: found duplicate key \"b\".* \(line 4, column 1\)"),
        ("a: 1\n---\nb: [1\n", r"document 2: not valid YAML: .* \(line 4, column 1\)"),
        ("a: !!int abc\n", r"document 1: not valid YAML: cannot decode !!str `abc` as a !!int \(line 1, column 4\)"),
        ('{"a": 1, "a": 2}', r"document 1: not valid JSON: duplicate key 'a'"),
        ('{"a": [1}', r"document 1: not valid JSON: .*\(line 1, column 9\)"),
    ],
)
def test_unreadable_input_names_the_document_and_the_place(text: str, message: str, parser: str) -> None:
    with pytest.raises(ReadError, match=message):
        load(text)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        "a: " + "[" * 900 + "]" * 900,
        "a:\n" + "".join(" " * n + "- b:\n" for n in range(0, 400, 2)),
    ],
)
def test_absurdly_deep_input_is_an_error_not_a_crash(text: str, parser: str) -> None:
    with pytest.raises(ReadError, match=r"document 1: nested deeper than 150 levels"):
        load(text)


def test_empty_documents_and_comments_stay_with_their_neighbours(parser: str) -> None:
    text = "# head\n---\n---\na: 1  # one\n# tail\n---\n# only a comment\n---\nb: 2\n...\n# after the end\n"

    found = load(text)

    assert [(doc.number, doc.body) for doc in found] == [(2, {"a": 1}), (4, {"b": 2})]
    assert dump((doc.source, doc.body, doc.body) for doc in found) == text
    changed = dump((doc.source, doc.body, {**doc.body, "c": "y"}) for doc in found)
    assert changed == (
        "# head\n---\n---\na: 1  # one\n# tail\nc: 'y'\n---\n# only a comment\n---\nb: 2\nc: 'y'\n...\n# after the end\n"
    )
    assert_all_read(changed, [{"a": 1, "c": "y"}, {"b": 2, "c": "y"}])


def test_a_byte_order_mark_is_dropped_and_directives_get_a_document_end(parser: str) -> None:
    first, second = load("\ufeffa: 1\n"), load("%YAML 1.1\n---\nb: 2\n")

    out = dump((doc.source, doc.body, doc.body) for doc in [*first, *second])

    assert out == "a: 1\n...\n%YAML 1.1\n---\nb: 2\n"
    assert_all_read(out, [{"a": 1}, {"b": 2}])


@pytest.mark.parametrize("name", sorted(path.name for path in FIXTURES.glob("*.yaml") if path.name != "bad.yaml"))
def test_libyaml_and_ruamel_cut_the_documents_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if manifest_yaml._GoLibyamlLoader is None:
        pytest.skip("PyYAML has no libyaml here")
    text = fixture_text(name) + "\n# é 日本 😀\n---\n%YAML 1.1\n---\nx: 'ü'\n...\n"

    with_libyaml = load(text)
    monkeypatch.setattr(manifest_yaml, "_GoLibyamlLoader", None)
    with_ruamel = load(text)

    assert [(doc.number, doc.source) for doc in with_libyaml] == [(doc.number, doc.source) for doc in with_ruamel]
    assert typed([doc.body for doc in with_libyaml]) == typed([doc.body for doc in with_ruamel])


# --- writing: every reader gets the strings back ----------------------------------------------


@settings(max_examples=400, deadline=None)
@given(value=tricky_strings, key=tricky_strings)
def test_a_written_string_is_a_string_to_every_reader(value: str, key: str) -> None:
    data = {"value": value, "list": [value, "x"], key: value, "nested": {"args": [value], key: {"k": value}}}

    assert_all_read(dump_plain(data), [data])


@pytest.mark.parametrize("value", TRICKY)
def test_each_tricky_string_is_quoted_when_a_reader_would_take_it_for_something_else(value: str) -> None:
    data = {"env": [{"name": "X", "value": value}], value: "key"}

    assert_all_read(dump_plain(data), [data])


def test_non_strings_are_written_so_that_every_reader_agrees() -> None:
    data = {
        "int": 31,
        "big": 2**63 - 1,
        "negative": -7,
        "float": 1e-5,
        "tiny": -2.5e-300,
        "whole": 3.0,
        "huge": 1e300,
        "t": True,
        "f": False,
        "none": None,
    }

    text = dump_plain(data)

    assert_all_read(text, [data])
    assert "'" not in text and '"' not in text


# --- the dry run: unchanged documents byte for byte, changed ones with their comments ---------


def run_mutate(*args: str, files: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``rocm-isolation-webhook mutate`` in this process (as the CLI parses it), on files written for it."""
    with tempfile.TemporaryDirectory() as folder:
        names = []
        for name, text in (files or {}).items():
            (Path(folder) / name).write_text(text, encoding="utf-8")
            names.append(str(Path(folder) / name))
        parser = argparse.ArgumentParser()
        dryrun.add_arguments(parser)
        parsed = parser.parse_args([*(arg for name in names for arg in ("-f", name)), *args])
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = dryrun.main(parsed)
    return code, out.getvalue(), err.getvalue()


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def patched_input(files: dict[str, str], *args: str) -> list[Any]:
    """The input read as go-yaml v2 reads it, with the dry run's own RFC 6902 patches applied."""
    documents = [found.body for text in files.values() for found in load(text)]
    code, out, _ = run_mutate("-o", "patch", *args, files=files)
    assert code in (dryrun.EXIT_ADMITTED, dryrun.EXIT_DENIED)
    entries = json.loads(out)
    by_index: dict[int, Any] = {}
    numbers = [(name, found.number) for name, text in files.items() for found in load(text)]
    for entry in entries:
        name = Path(entry["file"]).name
        index = numbers.index((name, entry["document"]))
        document = by_index.setdefault(index, documents[index])
        if "item" in entry:
            document["items"][entry["item"]] = jsonpatch.apply_patch(document["items"][entry["item"]], entry["patch"])
        else:
            by_index[index] = jsonpatch.apply_patch(document, entry["patch"])
    return [by_index.get(index, doc) for index, doc in enumerate(documents)]


def test_unchanged_documents_are_printed_byte_for_byte_and_the_changed_one_keeps_its_comments() -> None:
    text = fixture_text("fidelity.yaml")

    code, out, err = run_mutate("-q", files={"fidelity.yaml": text})

    assert code == dryrun.EXIT_DENIED  # the last pod asks for the reserved nodes
    assert "document 4: Job/ml-training/llama-finetune: mutated" in err
    assert "document 5: Pod/ml-training/sneaky: denied" in err
    # Namespace, ConfigMap and CPU Deployment before the Job, the denied Pod and trailing '---' after it:
    # exactly the input's text, comments, block scalars, flow mappings and quoting included.
    job_start, job_end = text.index("# The fine-tuning job"), text.index("---\n# Asks for")
    assert out.startswith(text[:job_start])
    assert out.endswith(text[job_end:])
    job = out[job_start : len(out) - len(text) + job_end]
    for comment in re.findall(r"#.*", text[job_start:job_end]):
        assert comment in job
    assert 'command: ["torchrun"]\n' in job and '- "y"          # answer yes' in job  # styles kept


def test_the_printed_manifests_mean_to_every_reader_what_the_patches_give() -> None:
    files = {"fidelity.yaml": fixture_text("fidelity.yaml"), "fidelity.json": fixture_text("fidelity.json")}

    code, out, _ = run_mutate("-q", files=files)

    assert code == dryrun.EXIT_DENIED
    expected = patched_input(files)
    # The Job was changed, and written by the dry run: every reader reads it alike. The unchanged
    # documents are the user's text, which means to kubectl what it meant (PyYAML reads the ConfigMap's
    # unquoted timestamp as a date, for one).
    assert_all_read(out, expected, only=[3])
    job = read_go(out)[3]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][3] == "y" and container["args"][5] == "1e-5"
    values = {env["name"]: env["value"] for env in container["env"]}
    assert values["NCCL_DEBUG"] == "off" and values["GRAD_ACCUM"] == "0x1F" and values["RUN_TAG"] == "~"
    # Strings to go-yaml that a YAML 1.1 reader takes for a number or a date: now quoted.
    assert values["CHECKPOINT_EVERY"] == "12:30" and values["DATASET_DATE"] == "2024-05-01"
    assert "value: '12:30'" in out and "value: '2024-05-01'" in out


def test_an_unchanged_json_document_is_printed_as_it_came_and_separated_from_the_next() -> None:
    pod, mixed = fixture_text("fidelity.json"), fixture_text("mixed.yaml")

    code, out, _ = run_mutate("-q", files={"a.json": pod, "b.yaml": mixed, "c.json": pod})

    assert code == dryrun.EXIT_DENIED  # mixed.yaml's second object
    assert out.startswith(pod + "---\n# One admitted training pod")
    assert out.endswith("---\n" + pod)
    assert len(read_go(out)) == 4


def test_a_changed_json_document_is_printed_as_yaml() -> None:
    review = fixture_text("review.json")

    code, out, _ = run_mutate("-q", "--namespace-label", f"{CLASS}=inference", files={"review.json": review})

    assert code == 0
    assert not out.lstrip().startswith("{")
    assert_all_read(out, patched_input({"review.json": review}, "--namespace-label", f"{CLASS}=inference"))


def test_an_unchanged_file_is_printed_exactly_as_it_is() -> None:
    text = fixture_text("passthrough.yaml")

    _, once, _ = run_mutate("-q", files={"passthrough.yaml": text})
    _, twice, _ = run_mutate("-q", files={"a.yaml": text, "b.yaml": text})

    assert once == text
    # The second file's first document gets no second '---': the first file ends with an empty one.
    assert twice == text + text


def test_files_without_separators_are_separated() -> None:
    first = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
    second = "# comment\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b"

    _, out, _ = run_mutate("-q", files={"a.yaml": first, "b.yaml": second})

    assert out == first + "---\n" + second + "\n"


def test_a_list_with_a_changed_item_keeps_the_other_items_comments() -> None:
    text = fixture_text("list.yaml").replace("    kind: Service\n", "    kind: Service  # the service\n")

    _, out, _ = run_mutate("-q", files={"list.yaml": text})

    assert "kind: Service  # the service" in out
    assert_all_read(out, patched_input({"list.yaml": text}))


def test_an_alias_is_a_copy_and_one_shared_with_a_changed_place_is_written_out(parser: str) -> None:
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p  # keep\nspec:\n  containers:\n"
        '    - name: a\n      env: &env\n        - name: X\n          value: "1"\n    - name: b\n      env: *env\n'
    )
    (found,) = load(text)
    after = jsonpatch.apply_patch(
        found.body, [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "Y"}}]
    )

    out = dump([(found.source, found.body, after)])

    # As kubectl reads it, each alias is a copy: the patch changes container a only.
    assert [len(container["env"]) for container in after["spec"]["containers"]] == [2, 1]
    assert_all_read(out, [after])
    assert "&" not in out and "*" not in out  # the anchored list could not stay shared: written afresh


def test_a_pod_with_anchors_and_aliases_goes_through_the_dry_run() -> None:
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p  # keep\nspec:\n  containers:\n"
        "    - name: a\n      image: rocm/pytorch\n      resources: &gpu\n        limits:\n          amd.com/gpu: 1\n"
        "    - name: b\n      image: rocm/pytorch\n      resources: *gpu\n"
    )

    _, out, _ = run_mutate("-q", "--namespace-label", f"{CLASS}=training", files={"pod.yaml": text})

    assert_all_read(out, patched_input({"pod.yaml": text}, "--namespace-label", f"{CLASS}=training"))


# --- generated manifests through the dry run ---------------------------------------------------


def manifests(strings: list[str], labels: dict[str, str]) -> list[dict[str, Any]]:
    """A GPU training Job (mutated) and a ConfigMap (passed through), holding the generated strings."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gen", "namespace": "ml-training", "annotations": dict(labels)},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "gen", **labels}, "annotations": {"example.com/note": strings[0]}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "rocm/pytorch:latest",
                            "command": [strings[0]],
                            "args": strings,
                            "env": [{"name": f"V{index}", "value": value} for index, value in enumerate(strings)],
                            "resources": {"limits": {"amd.com/gpu": 1}},
                        }
                    ],
                },
            }
        },
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gen", "namespace": "ml-training", "labels": dict(labels)},
        "data": {f"key{index}": value for index, value in enumerate(strings)},
    }
    return [job, config]


class _QuotedDumper(yaml.SafeDumper):
    """Block YAML whose every string is double-quoted: the way many generators write manifests."""


_QuotedDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
)


class _GoOnlyResolver(VersionedResolver):
    """Plain wherever go-yaml v2 reads a string: what a user who checks only with kubectl may write."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode and implicit[0]:
            return Tag(suffix=go_scalar(value)[0])
        return super().resolve(kind, value, (False, implicit[1]) if kind is ScalarNode else implicit)


def written(documents: list[dict[str, Any]], style: str) -> str:
    if style == "go-plain":
        writer = YAML(typ="rt", pure=True)
        writer.Resolver = _GoOnlyResolver
        writer.width = 2**16
        stream = io.StringIO()
        writer.dump_all(documents, stream)
        return stream.getvalue()
    if style == "json":
        return json.dumps(documents[0], indent=2, ensure_ascii=False)
    if style == "quoted":
        return yaml.dump_all(documents, Dumper=_QuotedDumper, allow_unicode=True, sort_keys=False, width=2**16)
    return dump([(None, doc, doc) for doc in documents])  # plain wherever every reader agrees


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    strings=st.lists(tricky_strings, min_size=1, max_size=5),
    labels=st.dictionaries(st.sampled_from(["tier", "team", "y", "on", "1:20"]), tricky_strings, max_size=3),
    style=st.sampled_from(["quoted", "plain", "go-plain", "json"]),
)
def test_generated_manifests_come_back_with_the_same_types_and_values(
    strings: list[str], labels: dict[str, str], style: str
) -> None:
    """Generated strings in a Job's command, args, env, labels and annotations, the input written as a
    generator writes it (every string double-quoted), as this module writes (plain where every reader
    agrees), as a user checking only with kubectl might (plain wherever go-yaml v2 reads a string), or
    as JSON: every reader gets the patched input back from the output, types and values."""
    documents = manifests(strings, labels)
    if style == "go-plain":
        # Only the Job: the ConfigMap would be printed as written, and PyYAML may not read that
        # (a plain '=' is its "value" tag); and ruamel's emitter folds raw NEL/LS/PS in single quotes.
        documents = documents[:1]
        assume(not any(re.search("[\x85\u2028\u2029]", value) for value in [*strings, *labels.values()]))
    text = written(documents, style)
    files = {"gen.json" if style == "json" else "gen.yaml": text}
    read = (lambda text: [json.loads(text)]) if style == "json" else read_go
    assert typed(read(text)) == typed(documents[:1] if style == "json" else documents)  # as generated

    code, out, err = run_mutate("-q", "--namespace-label", f"{CLASS}=training", files=files)

    assert code == 0, err
    assert "Job/ml-training/gen: mutated" in err
    expected = patched_input(files, "--namespace-label", f"{CLASS}=training")
    assert_all_read(out, expected)
    container = read_go(out)[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == strings
    assert [env["value"] for env in container["env"]][: len(strings)] == strings
    if style in ("quoted", "plain"):  # the ConfigMap is passed through: its text as it came
        assert out.endswith(text[text.rindex("\n---\n") + 1 :])
