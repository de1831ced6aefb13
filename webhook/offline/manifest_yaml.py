"""Manifests read as kubectl reads them, and written so that kubectl reads back what was meant.

kubectl turns YAML into JSON with sigs.k8s.io/yaml, which decodes with its fork of go-yaml v2
(``goyaml.v2``, YAML 1.1 rules: ``y``, ``on``, ``0x1F``, ``1_000``, ``1e-5``, ``.inf`` … are not
strings). ``go_scalar`` is that resolver. The input is parsed by libyaml (PyYAML's C extension;
go-yaml v2 is a port of it) or, without it, by ruamel.yaml, and resolved by ``go_scalar``, so the dry
run decides on the objects the apiserver would receive; each alias becomes its own copy, as in JSON.

Output: a document the dry run did not change is printed as the very text it came in (comments,
block scalars, quoting, key order, its own ``---``). A changed document is loaded again with
ruamel.yaml's round-trip loader, brought in line with the changed object, and written with its
comments and styles; any string that go-yaml v2, PyYAML (YAML 1.1) or ruamel.yaml (YAML 1.1 and 1.2)
would read as something else is quoted. The written text is read back with go-yaml v2's rules and
must equal the changed object; where it does not (an anchored node shared with a place that did not
change), the document is written afresh from the object, without comments.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from io import StringIO
from typing import Any

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.tag import Tag

NULL = "tag:yaml.org,2002:null"
BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
STR = "tag:yaml.org,2002:str"
MERGE = "tag:yaml.org,2002:merge"
TIMESTAMP = "tag:yaml.org,2002:timestamp"
BINARY = "tag:yaml.org,2002:binary"
# Not a YAML tag: what the writer's resolver answers when the resolvers it consults disagree.
AMBIGUOUS = "tag:rocm-isolation.io,2026:ambiguous"


class ReadError(ValueError):
    """The stream is not valid YAML or JSON; the message starts with ``document N:``."""


# --- go-yaml v2's resolver --------------------------------------------------------------------

# goyaml.v2/resolve.go: resolveMapList, looked up only when the first byte is one of its hints.
_GO_WORDS: dict[str, tuple[str, Any]] = {
    **{word: (BOOL, True) for word in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{word: (BOOL, False) for word in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{word: (NULL, None) for word in ("", "~", "null", "Null", "NULL")},
    **{word: (FLOAT, math.nan) for word in (".nan", ".NaN", ".NAN")},
    **{word: (FLOAT, math.inf) for word in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{word: (FLOAT, -math.inf) for word in ("-.inf", "-.Inf", "-.INF")},
}
_GO_HINTS = {**dict.fromkeys("+-", "S"), **dict.fromkeys("0123456789", "D"), **dict.fromkeys("yYnNtTfFoO~", "M")}
_GO_HINTS["."] = "."
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_DOT_FLOAT = re.compile(r"\.[0-9_]*(?:[eE][-+]?[0-9][0-9_]*)?")
_UINT64_MAX = 2**64 - 1
_INT64_MAX = 2**63 - 1
_SYNTAX, _RANGE = "syntax", "range"


@lru_cache(maxsize=8192)
def go_scalar(text: str) -> tuple[str, Any]:
    """The tag and value go-yaml v2 gives an unquoted scalar decoded into ``interface{}``.

    A port of ``resolve()`` in goyaml.v2/resolve.go (the copy sigs.k8s.io/yaml uses). A timestamp
    is returned as the string it is: decoding into ``interface{}`` keeps it a string (decode.go), and
    no timestamp is also a number, so its place first in resolve() changes nothing here. ``<<`` is
    left a string by resolve() ('<' is no hint) but decode.go's isMerge() merges an unquoted one.
    """
    if text == "<<":
        return MERGE, text
    hint = _GO_HINTS.get(text[:1], "N" if not text else "")
    if not hint:
        return STR, text
    if text in _GO_WORDS:
        return _GO_WORDS[text]
    if hint == ".":
        number = _go_dot_float(text)
        return (FLOAT, number) if number is not None else (STR, text)
    if hint in "DS":
        plain = text.replace("_", "")
        value, error = _go_parse_int(plain, 0)
        if error is None:
            return INT, value
        big, uint_error = _go_parse_uint(plain, 0)
        if uint_error is None:
            return INT, big
        if _YAML_STYLE_FLOAT.fullmatch(plain):
            number = float(plain)
            if not math.isinf(number):  # strconv.ParseFloat fails with ErrRange
                return FLOAT, number
        if plain.startswith("0b"):
            value, error = _go_parse_int(plain[2:], 2)
            if error is None:
                return INT, value
            value, error = _go_parse_uint(plain[2:], 2)
            if error is None:
                return INT, value
        elif plain.startswith("-0b"):
            value, error = _go_parse_int("-" + plain[3:], 2)
            if error is None:
                return INT, value
        if uint_error == _RANGE:  # math/big's SetString(plain, 0): a number too big for uint64
            return INT, big
    return STR, text


def _go_digit(char: str) -> int:
    if "0" <= char <= "9":
        return ord(char) - ord("0")
    if "a" <= char.lower() <= "z":
        return ord(char.lower()) - ord("a") + 10
    return 99


def _go_parse_uint(text: str, base: int) -> tuple[int, str | None]:
    """strconv.ParseUint(text, base, 64), underscores already removed: the value and the error's kind.

    A number too big for 64 bits is returned whole with the range error: resolve.go then hands that
    text to math/big's SetString, which accepts exactly these (unsigned, valid digits for the base).
    Go reports the range error even when a bad digit follows; SetString then fails, as this does.
    """
    if not text:
        return 0, _SYNTAX
    if base == 0:
        base = 10
        if text[0] == "0":
            prefix = text[1:2].lower()
            if len(text) >= 3 and prefix in ("b", "o", "x"):
                base, text = {"b": 2, "o": 8, "x": 16}[prefix], text[2:]
            else:
                base, text = 8, text[1:]
    number = 0
    for char in text:
        digit = _go_digit(char)
        if digit >= base:
            return 0, _SYNTAX
        number = number * base + digit
    return (number, None) if number <= _UINT64_MAX else (number, _RANGE)


def _go_parse_int(text: str, base: int) -> tuple[int, str | None]:
    """strconv.ParseInt(text, base, 64)."""
    if not text:
        return 0, _SYNTAX
    negative = text[0] == "-"
    unsigned, error = _go_parse_uint(text[1:] if text[0] in "+-" else text, base)
    if error == _SYNTAX:
        return 0, error
    if error == _RANGE or (not negative and unsigned > _INT64_MAX) or (negative and unsigned > _INT64_MAX + 1):
        return 0, _RANGE
    return (-unsigned if negative else unsigned), None


def _go_dot_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64) for a text starting with '.' (underscores not removed: resolve.go does not)."""
    mantissa = text.split("e")[0].split("E")[0]
    if not _GO_DOT_FLOAT.fullmatch(text) or not any(char.isdigit() for char in mantissa):
        return None
    if "_" in text and not _go_underscores_ok(text):
        return None
    number = float(text.replace("_", ""))
    return None if math.isinf(number) else number


def _go_underscores_ok(text: str) -> bool:
    """strconv's underscoreOK: each underscore sits between two digits."""
    saw = "^"
    for char in text:
        if char.isdigit():
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


# --- reading ----------------------------------------------------------------------------------


class _GoResolver(VersionedResolver):
    """Plain scalars resolved as go-yaml v2 resolves them; quoted and block scalars are strings."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode and implicit[0]:
            return _tag(go_scalar(value)[0])
        return super().resolve(kind, value, (False, implicit[1]) if kind is ScalarNode else implicit)


@lru_cache(maxsize=16)
def _tag(name: str) -> Tag:
    return Tag(suffix=name)


def _go_value(text: str, wanted: str) -> Any:
    """A scalar tagged (or resolved) bool, int, float, null, timestamp or binary, as go-yaml v2 decodes it."""
    if wanted == TIMESTAMP:
        return text  # decoded into interface{}, a timestamp stays a string
    if wanted == BINARY:
        return _binary(text)
    tag, value = go_scalar(text)
    if tag == wanted:
        return value
    if wanted == FLOAT and tag == INT:
        return float(value)
    short = {NULL: "!!null", BOOL: "!!bool", INT: "!!int", FLOAT: "!!float", STR: "!!str", MERGE: "!!merge"}
    raise ValueError(f"cannot decode {short.get(tag, tag)} `{text}` as a {short.get(wanted, wanted)}")


def _construct_go(constructor: Any, node: Any) -> Any:
    try:
        return _go_value(str(constructor.construct_scalar(node)), str(node.tag))
    except ValueError as err:
        raise ConstructorError(None, None, str(err), node.start_mark) from None


def _binary(text: str) -> str:
    import base64
    import binascii

    try:
        return base64.b64decode("".join(text.split()), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as err:
        raise ValueError(f"cannot decode !!binary: {err}") from None


class _GoConstructor(SafeConstructor):
    """Plain Python objects, as go-yaml v2 decodes into interface{}; duplicate keys are errors."""


class _GoRoundTripConstructor(RoundTripConstructor):
    """Round-trip objects (comments, quoting kept) whose scalar values are go-yaml v2's."""


for _constructor in (_GoConstructor, _GoRoundTripConstructor):
    for _name in (NULL, BOOL, INT, FLOAT, TIMESTAMP, BINARY):
        _constructor.add_constructor(_name, _construct_go)


@dataclass(frozen=True)
class _Span:
    """Where a document's events lie in the text (character offsets)."""

    start: int  # the document's first token: a directive or its '---', or its content when implicit
    content: int  # just after '---' (== start when implicit)
    content_end: int  # where its '...' is, if explicit, else == end
    end: int  # after its '...' when explicit, else where the next token (a '---') begins
    explicit_start: bool
    explicit_end: bool


class _SpanComposer(Composer):
    """Composes each document and notes where it starts and ends, to print it unchanged later."""

    def compose_document(self) -> Any:
        self.anchors = {}
        start = self.parser.get_event()
        node = self.compose_node(None, None)
        end = self.parser.get_event()
        spans = self.__dict__.setdefault("spans", [])
        spans.append(
            _Span(
                start=start.start_mark.index,
                content=start.end_mark.index,
                content_end=end.start_mark.index,
                end=end.end_mark.index,
                explicit_start=bool(start.explicit),
                explicit_end=bool(end.explicit),
            )
        )
        return node


def _reader(round_trip: bool = False) -> YAML:
    reader = YAML(typ="rt" if round_trip else "safe", pure=True)
    reader.Resolver = _GoResolver
    reader.Constructor = _GoRoundTripConstructor if round_trip else _GoConstructor
    reader.Composer = _SpanComposer
    reader.allow_duplicate_keys = False
    if round_trip:
        reader.preserve_quotes = True
    return reader


@dataclass(frozen=True)
class Source:
    """A document's text as it came in: from the end of the document before it to its own end.

    Empty documents around it (a trailing ``---``, a ``---`` with only comments) are not objects; their
    text goes with the object before them (or, at the start of a file, the one after them), so that
    an unchanged file is printed exactly as it was.
    """

    text: str
    content: int  # where the document's content starts in ``text`` (after its '---')
    end: int  # where its content ends; after it come its '...', if any, and empty documents
    explicit_start: bool  # ``text`` starts a document with '---' before any content
    open_end: bool  # ``text`` ends in an empty document opened with '---': what follows goes in it
    directives: bool  # '%YAML' or '%TAG' before its '---'
    json: bool = False


@dataclass(frozen=True)
class Loaded:
    number: int  # 1-based, counting null documents too
    body: Any  # plain dicts, lists, str, int, float, bool, None
    source: Source


# Deeper objects are refused: printing one takes a few Python frames per level (no manifest nests
# half as deep; a CRD's openAPIV3Schema rarely passes 60).
MAX_DEPTH = 150


def load(text: str) -> list[Loaded]:
    """The documents of a YAML or JSON stream as kubectl reads them; null documents are skipped."""
    return _load(text.removeprefix("\ufeff"))


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if children and depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _load(text: str) -> list[Loaded]:
    json_error: json.JSONDecodeError | None = None
    if text.lstrip().startswith(("{", "[")):
        try:
            body = json.loads(text, object_pairs_hook=_json_object)
        except json.JSONDecodeError as err:
            json_error = err  # maybe YAML flow style; if YAML fails too, the JSON error is the better one
        except RecursionError:
            raise ReadError(f"document 1: nested deeper than {MAX_DEPTH} levels") from None
        else:
            source = Source(text, 0, len(text), explicit_start=False, open_end=False, directives=False, json=True)
            return [] if body is None else [Loaded(1, _shallow([body])[0], source)]
    bodies: list[Any] = []
    try:
        if _GoLibyamlLoader is not None:
            bodies.extend(pyyaml.load_all(text, Loader=_GoLibyamlLoader))
            spans = _libyaml_spans(text, len(bodies))
            if spans is not None:
                return _sources(text, _shallow(bodies), spans)
            bodies.clear()
        reader = _reader()
        bodies.extend(reader.load_all(text))
    except (YAMLError, ConstructorError, pyyaml.YAMLError) as err:
        if json_error is not None:
            raise ReadError(
                f"document 1: not valid JSON: {json_error.msg} (line {json_error.lineno}, column {json_error.colno})"
            ) from None
        raise ReadError(f"document {len(bodies) + 1}: not valid YAML: {_problem(err)}") from None
    except RecursionError:
        raise ReadError(f"document {len(bodies) + 1}: nested deeper than {MAX_DEPTH} levels") from None
    return _sources(text, _shallow(bodies), reader.composer.__dict__.get("spans", []))


def _shallow(bodies: list[Any]) -> list[Any]:
    for number, body in enumerate(bodies, start=1):
        if _too_deep(body):
            raise ReadError(f"document {number}: nested deeper than {MAX_DEPTH} levels")
    return bodies


def _libyaml_spans(text: str, count: int) -> list[_Span] | None:
    """The documents' spans from libyaml's events; None unless its marks are character offsets into ``text``."""
    spans: list[_Span] = []
    start: Any = None
    for event in pyyaml.parse(text, Loader=pyyaml.CSafeLoader):
        if isinstance(event, pyyaml.DocumentStartEvent):
            start = event
        elif isinstance(event, pyyaml.DocumentEndEvent) and start is not None:
            finish: Any = event
            span = _Span(
                start=start.start_mark.index,
                content=start.end_mark.index,
                content_end=finish.start_mark.index,
                end=finish.end_mark.index,
                explicit_start=bool(start.explicit),
                explicit_end=bool(finish.explicit),
            )
            if (span.explicit_start and text[span.content - 3 : span.content] != "---") or (
                span.explicit_end and text[span.content_end : span.end] != "..."
            ):
                return None
            spans.append(span)
    ends = [0, *(value for span in spans for value in (span.start, span.content, span.content_end, span.end))]
    if len(spans) != count or ends != sorted(ends) or ends[-1] > len(text):
        return None
    return spans


def _sources(text: str, bodies: list[Any], spans: list[_Span]) -> list[Loaded]:
    loaded: list[Loaded] = []
    start = 0  # where the next object's text starts (empty documents before it included)
    for number, (body, span) in enumerate(zip(bodies, spans, strict=True), start=1):
        if body is None:
            if loaded:  # an empty document after an object: its text goes with that object
                last = loaded[-1]
                tail = span.explicit_start and not span.explicit_end
                loaded[-1] = Loaded(last.number, last.body, _with_tail(last.source, text[start : span.end], tail))
                start = span.end
            continue
        explicit = (spans[0] if not loaded else span).explicit_start
        directives = re.search(r"(?m)^%", text[start : span.content]) is not None
        content, end = span.content - start, span.content_end - start
        source = Source(text[start : span.end], content, end, explicit, False, directives)
        loaded.append(Loaded(number, _unshared(body), source))
        start = span.end
    if loaded and start < len(text):  # comments after an explicit end ('...')
        last = loaded[-1]
        loaded[-1] = Loaded(last.number, last.body, _with_tail(last.source, text[start:], last.source.open_end))
    return loaded


def _unshared(value: Any) -> Any:
    """Each alias its own copy, as kubectl's YAML-to-JSON conversion makes it: a patch to one place
    must not show up in another (jsonpatch's deepcopy would keep the sharing)."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def _with_tail(source: Source, tail: str, open_end: bool) -> Source:
    return Source(
        source.text + tail, source.content, source.end, source.explicit_start, open_end, source.directives, source.json
    )


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise json.JSONDecodeError(f"duplicate key {key!r}", "", 0)
        result[key] = value
    return result


def _problem(err: Exception) -> str:
    if not isinstance(err, (MarkedYAMLError, pyyaml.MarkedYAMLError)):
        return str(err).strip()
    problem = err.problem or err.context or "syntax error"
    mark = err.problem_mark or err.context_mark
    return problem if mark is None else f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def load_go(text: str) -> list[Any]:
    """Every document of a YAML stream, read with go-yaml v2's rules (null documents included).

    With libyaml (PyYAML's C extension) when it is there: go-yaml v2 is a port of libyaml, so its
    scanner and parser are the closest to kubectl's; else with the same reader as ``load``.
    """
    if _GoLibyamlLoader is not None:
        return list(pyyaml.load_all(text, Loader=_GoLibyamlLoader))
    return list(_reader().load_all(text))


def _go_libyaml_loader() -> Any:
    base = getattr(pyyaml, "CSafeLoader", None)
    if base is None:
        return None

    class GoLibyamlLoader(base):  # type: ignore[misc, valid-type]
        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            if kind is pyyaml.ScalarNode and implicit[0]:
                return go_scalar(value)[0]
            return super().resolve(kind, value, (False, implicit[1]) if kind is pyyaml.ScalarNode else implicit)

    def construct(loader: Any, node: Any) -> Any:
        try:
            return _go_value(str(loader.construct_scalar(node)), str(node.tag))
        except ValueError as err:
            raise pyyaml.constructor.ConstructorError(None, None, str(err), node.start_mark) from None

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        # PyYAML keeps the last of duplicate keys; kubectl's apiserver rejects them: so does the dry run.
        seen: list[Any] = []
        for key_node, _ in node.value:
            if key_node.tag == MERGE:
                continue
            key = loader.construct_object(key_node, deep=True)
            if any(same(key, other) for other in seen):
                raise pyyaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f'found duplicate key "{key}"', key_node.start_mark
                )
            seen.append(key)
        return pyyaml.constructor.SafeConstructor.construct_mapping(loader, node, deep)

    GoLibyamlLoader.construct_mapping = construct_mapping
    for name in (NULL, BOOL, INT, FLOAT, TIMESTAMP, BINARY):
        GoLibyamlLoader.add_constructor(name, construct)
    return GoLibyamlLoader


_GoLibyamlLoader = _go_libyaml_loader()


# --- writing ----------------------------------------------------------------------------------

_PYYAML_RESOLVER = pyyaml.resolver.Resolver()


class _QuotingResolver(VersionedResolver):
    """A plain scalar means its type only when go-yaml v2, PyYAML and ruamel.yaml (1.1, 1.2) agree."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode and implicit[0]:
            return _tag(plain_tag(value))
        return super().resolve(kind, value, (False, implicit[1]) if kind is ScalarNode else implicit)


_RUAMEL_11 = VersionedResolver(version=(1, 1))
_RUAMEL_12 = VersionedResolver(version=(1, 2))


@lru_cache(maxsize=4096)
def plain_tag(text: str) -> str:
    """The tag every resolver gives ``text`` written unquoted, or AMBIGUOUS when they differ."""
    tags = {
        go_scalar(text)[0],
        str(_PYYAML_RESOLVER.resolve(pyyaml.ScalarNode, text, (True, False))),  # type: ignore[no-untyped-call]
        str(_RUAMEL_11.resolve(ScalarNode, text, (True, False))),
        str(_RUAMEL_12.resolve(ScalarNode, text, (True, False))),
    }
    return tags.pop() if len(tags) == 1 else AMBIGUOUS


class _Representer(RoundTripRepresenter):
    """Anchors only where the input had them: objects shared in memory are written out in full."""

    def ignore_aliases(self, data: Any) -> bool:
        anchor = getattr(data, "anchor", None)
        return not (anchor is not None and getattr(anchor, "value", None) is not None)

    def represent_str(self, data: str) -> Any:
        # In single quotes the emitter writes NEL, LS and PS raw, and readers fold them to spaces.
        if _LINE_SEPARATORS.search(data):
            return self.represent_scalar(STR, data, style='"')
        return super().represent_str(data)

    def represent_float(self, data: float) -> Any:
        # ruamel writes 1e-05 without a dot, which YAML 1.1 reads as a string: write 1.0e-05.
        if math.isnan(data):
            text = ".nan"
        elif math.isinf(data):
            text = ".inf" if data > 0 else "-.inf"
        else:
            text = repr(data).lower()
            if "." not in text and "e" in text:
                text = text.replace("e", ".0e", 1)
        return self.represent_scalar(FLOAT, text)


_LINE_SEPARATORS = re.compile("[\x85\u2028\u2029]")
_Representer.add_representer(str, _Representer.represent_str)
_Representer.add_representer(float, _Representer.represent_float)


def _writer(mapping: int = 2, sequence: int = 2, offset: int = 0) -> YAML:
    writer = YAML(typ="rt", pure=True)
    writer.Resolver = _QuotingResolver
    writer.Representer = _Representer
    writer.width = 2**16  # never fold a long string over lines
    writer.indent(mapping=mapping, sequence=sequence, offset=offset)
    return writer


def _dumped(writer: YAML, data: Any) -> str:
    stream = StringIO()
    writer.dump(data, stream)
    return stream.getvalue()


def dump_plain(data: Any) -> str:
    """One document written afresh from a plain object (block style, strings quoted where needed)."""
    return _dumped(_writer(), data)


def dump(documents: Iterable[tuple[Source | None, Any, Any]]) -> str:
    """A multi-document stream: (source, object as read, object to print) for each document.

    Documents are separated by a '---' line (kubectl splits a stream at those lines only).
    """
    out: list[str] = []
    open_end = False  # the text so far ends in an empty document opened with '---'
    for source, before, after in documents:
        text, explicit_start, directives = _document_text(source, before, after)
        if out:
            if not out[-1].endswith("\n"):
                out.append("\n")
            if directives:
                out.append("...\n")
            elif not explicit_start and not open_end:
                out.append("---\n")
        out.append(text)
        open_end = source is not None and source.open_end
    if out and not out[-1].endswith("\n"):
        out.append("\n")
    return "".join(out)


def _document_text(source: Source | None, before: Any, after: Any) -> tuple[str, bool, bool]:
    """The document's text, whether it starts with its own '---', and whether it has directives."""
    if source is None:
        return dump_plain(after), False, False
    if same(before, after) and (not source.json or _reads_as(source.text, after)):
        return source.text, source.explicit_start, source.directives
    if source.json:
        return dump_plain(after), False, False
    head, tail = source.text[: source.content], source.text[source.end :]
    head = head if not head or head.endswith("\n") else head + "\n"
    text = _round_trip(source.text[source.content : source.end], after) or dump_plain(after)
    return head + text + tail, source.explicit_start, source.directives


def _reads_as(text: str, expected: Any) -> bool:
    try:
        documents = [doc for doc in load_go(text) if doc is not None]
    except (YAMLError, ConstructorError, pyyaml.YAMLError):
        return False
    return len(documents) == 1 and same(documents[0], expected)


def _round_trip(content: str, after: Any) -> str | None:
    """The document re-read with comments and styles, changed into ``after``, written back; None if that fails."""
    try:
        tree = _sync(_reader(round_trip=True).load(content), after)
        text = _dumped(_writer(*_guess_indent(content)), tree)
    except (YAMLError, ConstructorError):  # e.g. a %TAG handle declared before the '---'
        return None
    return text if _reads_as(text, after) else None


def _sync(tree: Any, new: Any) -> Any:
    """``tree`` changed in place to equal ``new``, touching only what differs (comments stay where they were)."""
    if isinstance(tree, dict) and isinstance(new, dict):
        for key in [key for key in tree if key not in new]:
            del tree[key]
        for key, value in new.items():
            if key not in tree:
                tree[key] = value
            elif not same(tree[key], value):
                tree[key] = _sync(tree[key], value)
        return tree
    if isinstance(tree, list) and isinstance(new, list):
        for index, value in enumerate(new[: len(tree)]):
            if not same(tree[index], value):
                tree[index] = _sync(tree[index], value)
        while len(tree) > len(new):
            del tree[len(tree) - 1]  # one by one: CommentedSeq moves its comments per index
        tree.extend(new[len(tree) :])
        return tree
    return tree if same(tree, new) else new


def same(a: Any, b: Any) -> bool:
    """Equal as JSON would be: types matter (True is not 1, 1 is not 1.0), NaN equals NaN, order of keys not."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return len(a) == len(b) and all(key in b and same(value, b[key]) for key, value in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    kinds = (bool, int, float, str)
    kind_a = next((kind for kind in kinds if isinstance(a, kind)), type(a))
    kind_b = next((kind for kind in kinds if isinstance(b, kind)), type(b))
    if kind_a is not kind_b:
        return False
    if kind_a is float and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) the document is written with: kept when re-written."""
    mapping: int | None = None
    key_line: int | None = None  # indentation of the last line that was only ``key:``
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if key_line is not None and stripped.startswith("- ") and indent >= key_line:
            after_dash = len(line) - len(stripped[1:].lstrip(" ")) - indent
            return mapping or 2, indent - key_line + after_dash, indent - key_line
        if key_line is not None and mapping is None and indent > key_line:
            mapping = indent - key_line
        key_line = indent if stripped.endswith(":") and not stripped.startswith("- ") else None
    return mapping or 2, 2, 0
