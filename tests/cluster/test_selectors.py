"""Label and field selectors as the apiserver evaluates them (webhook/cluster/selectors.py), table-driven;
tests/cluster/test_view.py compares them with the fake apiserver's own on the same objects."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.cluster.selectors import field_matcher, label_matcher

OBJ: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"app": "web", "tier": "front", "rocm-isolation.io/borrow": "true"}},
    "spec": {"nodeName": "n1"},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        (None, True),
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),  # != also selects objects without the key
        ("app in (web,db)", True),
        ("app in (db)", False),
        ("app notin (db)", True),
        ("missing notin (db)", True),
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("app=web,tier in (front,back),!missing", True),
        ("app=web,tier=back", False),
        ("rocm-isolation.io/borrow=true", True),
    ],
)
def test_label_selectors(selector: str | None, selected: bool) -> None:
    assert label_matcher(selector)(OBJ) is selected


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("status.phase!=Succeeded,status.phase!=Failed", True),
        ("status.phase=Running", True),
        ("spec.nodeName=n1", True),
        ("spec.nodeName==n2", False),
        ("spec.nodeName=", False),
        ("spec.schedulerName=", True),  # absent reads as ""
        ("metadata.name=p,spec.nodeName!=n1", False),
    ],
)
def test_field_selectors(selector: str, selected: bool) -> None:
    assert field_matcher(selector)(OBJ) is selected


@pytest.mark.parametrize("selector", ["app in web", "a b", "!app in (x)"])
def test_a_selector_it_does_not_understand_is_an_error_not_a_guess(selector: str) -> None:
    with pytest.raises(ValueError):
        label_matcher(selector)
    with pytest.raises(ValueError):
        field_matcher("status.phase>1")
