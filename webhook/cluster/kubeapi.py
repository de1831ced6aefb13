"""A thin raw-JSON client for the Kubernetes API, shared by ``audit`` and ``pool``.

It rides on the ``kubernetes`` client's ``ApiClient`` (same kubeconfig / in-cluster loading as
``cache.load_api_client``, same TLS and bearer-token handling, token refresh included) but never
deserializes into the client's models: objects are read as plain JSON dicts, as the watch cache in
``cache.py`` does. A Pod model costs far more than its dict, and a large cluster lists 100,000s.

- ``list`` pages through a collection with ``limit``/``continue`` and yields raw items.
- ``get`` reads one object.
- Errors are typed (``ApiError`` and its subclasses), carrying the apiserver's ``Status``
  ``reason`` and ``message``, so callers can say what happened the way kubectl does.

Expired continue tokens (410 Gone, reason ``Expired``, when paging takes longer than the etcd
compaction window, ~5 minutes): client-go's pager (``tools/pager``) handles them two ways.
``ListPager.List`` falls back to one full, unpaginated list at the requested resourceVersion;
``ListPager.EachListItem``, which streams items to a callback as this ``list`` does, returns the
``Expired`` error. ``list`` follows ``EachListItem`` by default (it cannot take back items already
yielded), and with ``on_restart`` it follows ``List``'s fallback: it calls ``on_restart()`` (the
caller drops what it accumulated) and lists again from the start, still paginated so that memory
stays flat (the one difference from client-go, whose fallback is a single unpaginated request).
The "inconsistent continue token" that the apiserver offers in the 410 Status is not used: the
apiserver itself warns that objects changed meanwhile may then show up twice or not at all.

Reads are retried, as client-go's REST client does, when the apiserver answers 429 or 5xx with a
``Retry-After`` header (API Priority and Fairness rejects requests that way); nothing else is
retried here.
"""

from __future__ import annotations

import builtins
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypedDict, Unpack
from urllib.parse import quote

import orjson

DEFAULT_PAGE_SIZE: Final = 500  # client-go's pager default
DEFAULT_TIMEOUT: Final = (10.0, 60.0)  # (connect, read) seconds per request
MAX_RETRIES: Final = 3
MAX_RETRY_WAIT: Final = 10.0

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"  # server-side apply (a JSON body is valid YAML)


class ApiError(Exception):
    """The API answered with an error, or could not be reached (``status`` 0).

    ``reason`` and ``message`` come from the apiserver's ``Status`` object when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        method: str = "GET",
        path: str = "",
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.message = message
        self.status = status
        self.reason = reason
        self.method = method
        self.path = path
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after
        super().__init__(message)

    def __str__(self) -> str:
        # kubectl's wording: "Error from server (Forbidden): pods is forbidden: ..."
        if self.status:
            return f"Error from server ({self.reason or self.status}): {self.message}"
        return self.message


class Unreachable(ApiError):
    """No answer: connection refused or cut, TLS failure, timeout."""


class NotFound(ApiError):
    """404: the object does not exist, or the API (group/version/resource) is not served."""


class Forbidden(ApiError):
    """401 or 403: the credentials are missing, wrong, or not allowed to do this (RBAC)."""


class Conflict(ApiError):
    """409: the object changed since it was read (resourceVersion precondition) or already exists."""


class Expired(ApiError):
    """410: a resourceVersion or continue token is too old. ``continue_token`` is the apiserver's
    offer to read the rest of the list inconsistently (not used here, see the module docstring)."""

    def __init__(self, message: str, *, continue_token: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.continue_token = continue_token


class TooManyRequests(ApiError):
    """429: API Priority and Fairness throttled the request, or an eviction was refused by a
    PodDisruptionBudget. ``retry_after`` is the server's ``Retry-After`` when it sent one."""


_BY_STATUS: Final[dict[int, type[ApiError]]] = {
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Expired,
    429: TooManyRequests,
}


def api_path(
    group_version: str,
    resource: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object: ``api_path("v1", "pods", namespace="a")`` is
    ``/api/v1/namespaces/a/pods``; ``api_path("coordination.k8s.io/v1", "leases", ...)`` is under ``/apis``."""
    root = "/api/" if group_version == "v1" else "/apis/"
    path = root + group_version
    if namespace is not None:
        path += "/namespaces/" + quote(namespace, safe="")
    path += "/" + resource
    if name is not None:
        path += "/" + quote(name, safe="")
        if subresource:
            path += "/" + subresource
    return path


def error_from_response(status: int, body: bytes, headers: Mapping[str, str], *, method: str, path: str) -> ApiError:
    """The typed error for a non-2xx answer (its ``Status`` body read when it is one)."""
    reason, message, details, continue_token = "", "", None, ""
    try:
        document = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict) and document.get("kind") == "Status":
        reason = str(document.get("reason") or "")
        message = str(document.get("message") or "")
        details = document.get("details") if isinstance(document.get("details"), dict) else None
        continue_token = str((document.get("metadata") or {}).get("continue") or "")
    if not message:
        text = body.decode("utf-8", "replace").strip()[:200]
        message = f"{method} {path}: HTTP {status}" + (f": {text}" if text else "")
    retry_after = _retry_after(headers)
    cls = _BY_STATUS.get(status, ApiError)
    if cls is Expired:
        return Expired(
            message,
            continue_token=continue_token,
            status=status,
            reason=reason or "Expired",
            method=method,
            path=path,
            details=details,
        )
    return cls(
        message, status=status, reason=reason, method=method, path=path, details=details, retry_after=retry_after
    )


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def resources_served(api: KubeApi, group_version: str) -> frozenset[str] | None:
    """The resource names API discovery lists for ``group_version`` (``GET /apis/GROUP/VERSION``); None
    when that version is not served. Raises ``ApiError`` (not ``NotFound``) when discovery cannot be read."""
    try:
        document = api.get(f"/apis/{group_version}")
    except NotFound:
        return None
    resources = document.get("resources")
    return frozenset(
        str(r.get("name")) for r in (resources if isinstance(resources, list) else []) if isinstance(r, Mapping)
    )


class RequestOptions(TypedDict, total=False):
    """A request's query parameters, body and its content type (JSON unless a patch says otherwise)."""

    query: Mapping[str, str] | None
    body: Any
    content_type: str


class ListOptions(TypedDict, total=False):
    """What narrows a list: label and field selectors, items per page, what to do when it starts over."""

    label_selector: str | None
    field_selector: str | None
    limit: int | None
    on_restart: Callable[[], None] | None


class KubeApi:
    """Raw-JSON requests through an ``ApiClient`` (its host, TLS settings and credentials)."""

    def __init__(
        self,
        api_client: Any,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        max_retries: int = MAX_RETRIES,
        sleep: Callable[[float], None] = time.sleep,
        prefetch: int = 0,
    ) -> None:
        self.api_client = api_client
        self.page_size = page_size
        self.timeout = timeout
        self.max_retries = max_retries
        self._sleep = sleep
        self.prefetch = prefetch
        _own_retries(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, context: str | None = None, **kwargs: Any) -> KubeApi:
        """From ``kubeconfig``, else in-cluster configuration, else ``$KUBECONFIG`` / ``~/.kube/config``;
        ``context``: that kubeconfig context instead of the current one."""
        from webhook.cluster.cache import load_api_client

        try:
            api_client = load_api_client(kubeconfig, context)
        except Exception as err:  # the kubernetes client raises several types for a bad kubeconfig
            raise Unreachable(f"cannot load the kubeconfig: {err}") from None
        if api_client is None:
            raise Unreachable("no cluster configuration: pass --kubeconfig, set KUBECONFIG, or run in a cluster")
        return cls(api_client, **kwargs)

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    def close(self) -> None:
        self.api_client.close()

    # -- reads ----------------------------------------------------------------------------------

    def get(self, path: str, *, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One object (or any JSON document the API serves at ``path``)."""
        return self._object("GET", path, query=query)

    def text(self, path: str) -> str:
        """A plain-text document the API serves (``/metrics``). Raises ``ApiError`` (typed) for anything but 2xx."""
        status, data, headers = self._send("GET", path, None, None, JSON)
        if 200 <= status <= 299:
            return data.decode("utf-8", errors="replace")
        raise error_from_response(status, data, headers, method="GET", path=path)

    def serving_versions(self, group: str, versions: Sequence[str], resource: str) -> tuple[str, ...]:
        """Which of ``versions`` of ``group`` list ``resource`` in their API discovery, in the order given
        (``resources_served``)."""
        return tuple(v for v in versions if resource in (resources_served(self, f"{group}/{v}") or ()))

    def list(self, path: str, **options: Unpack[ListOptions]) -> Iterator[dict[str, Any]]:
        """The items of a collection, page by page (``limit`` items per request; ``ListOptions``).

        An expired continue token raises ``Expired``, unless ``on_restart`` is given: then it is
        called and the list starts over (see the module docstring)."""
        for page in self.pages(path, **options):
            yield from page

    def pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        on_restart: Callable[[], None] | None = None,
    ) -> Iterator[builtins.list[dict[str, Any]]]:
        """The items of a collection, one list per page.

        With ``prefetch`` pages (set on the client), a thread fetches and decodes the next pages
        while the caller works on the current one, as client-go's ``EachListItem`` buffers pages
        (``PageBufferSize``, 10 there): the apiserver's time then overlaps the caller's."""
        query: dict[str, str] = {"limit": str(limit or self.page_size)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        fetched = self._fetch(path, query, restartable=on_restart is not None)
        if self.prefetch > 0:
            fetched = _buffered(fetched, self.prefetch)
        for page in fetched:
            if page is _RESTART:
                assert on_restart is not None
                on_restart()
                continue
            yield page

    def _fetch(self, path: str, query: dict[str, str], *, restartable: bool) -> Iterator[builtins.list[dict[str, Any]]]:
        continue_token = ""
        while True:
            page_query = dict(query)
            if continue_token:
                page_query["continue"] = continue_token
            try:
                document = self.request("GET", path, query=page_query)
            except Expired:
                if not continue_token or not restartable:
                    raise
                yield _RESTART
                continue_token = ""
                continue
            if not isinstance(document, dict):
                raise ApiError(f"GET {path}: the answer is not a list", method="GET", path=path)
            items = document.get("items") or []
            if not isinstance(items, list):
                raise ApiError(f"GET {path}: items is not a list", method="GET", path=path)
            yield items
            continue_token = str((document.get("metadata") or {}).get("continue") or "")
            if not continue_token:
                return

    # -- writes (pool: patch, post; the background audit's reports: apply, delete) ----------------

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the collection at ``path``; the created object."""
        return self._object("POST", path, body=body)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT ``body`` (with its ``metadata.resourceVersion``: 409 ``Conflict`` when it changed)."""
        return self._object("PUT", path, body=body)

    def patch(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of the object at ``path``; the object after it.

        A ``metadata.resourceVersion`` in the patch is a precondition: 409 ``Conflict`` when the
        object changed since. ``dry_run`` sends ``dryRun=All``: validated and admitted, not persisted."""
        return self._object("PATCH", path, query=_dry_run(dry_run), body=body, content_type=MERGE_PATCH)

    def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False) -> dict[str, Any]:
        """Server-side apply of ``body`` (the whole intent of ``field_manager``) to the object at ``path``,
        created when it does not exist; the object after it. ``force`` takes over fields another
        manager owns instead of answering 409 ``Conflict``."""
        query = {"fieldManager": field_manager, **({"force": "true"} if force else {})}
        return self._object("PATCH", path, query=query, body=body, content_type=APPLY_PATCH)

    def delete(self, path: str) -> None:
        """DELETE the object at ``path`` (``NotFound`` when it is already gone)."""
        self.request("DELETE", path)

    def post(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Any:
        """POST ``body`` to ``path`` (a collection or a subresource such as ``pods/NAME/eviction``);
        the decoded answer (an eviction answers a ``Status``)."""
        return self.request("POST", path, query=_dry_run(dry_run), body=body)

    # -- transport ------------------------------------------------------------------------------

    def _object(self, method: str, path: str, **options: Unpack[RequestOptions]) -> dict[str, Any]:
        """``request`` for an answer that must be one JSON object (an object, or a discovery document)."""
        document = self.request(method, path, **options)
        if not isinstance(document, dict):
            raise ApiError(f"{method} {path}: the answer is not a JSON object", method=method, path=path)
        return document

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Any:
        """One request; the decoded JSON answer. Raises ``ApiError`` (typed) for anything but 2xx."""
        attempt = 0
        while True:
            status, data, headers = self._send(method, path, query, body, content_type)
            if 200 <= status <= 299:
                try:
                    return orjson.loads(data) if data else None
                except orjson.JSONDecodeError as err:
                    raise ApiError(
                        f"{method} {path}: the answer is not JSON ({err})", status=status, method=method, path=path
                    ) from None
            error = error_from_response(status, data, headers, method=method, path=path)
            retryable = method == "GET" and (status == 429 or status >= 500) and error.retry_after is not None
            if not retryable or attempt >= self.max_retries:
                raise error
            attempt += 1
            self._sleep(min(error.retry_after or 0.0, MAX_RETRY_WAIT))

    def _send(
        self, method: str, path: str, query: Mapping[str, str] | None, body: Any, content_type: str
    ) -> tuple[int, bytes, Mapping[str, str]]:
        import urllib3

        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, serialized, _ = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(
                method, url, header_params=headers, body=serialized, _request_timeout=self.timeout
            )
            try:
                data = response.read()
            finally:
                response.response.release_conn()
            return int(response.status), bytes(data or b""), dict(response.headers or {})
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unreachable(
                f"cannot reach the Kubernetes API at {self.host} ({method} {path}): {_cause(err)}",
                method=method,
                path=path,
            ) from None


def _dry_run(dry_run: bool) -> dict[str, str] | None:
    return {"dryRun": "All"} if dry_run else None


# A page that means "the list starts over" (its continue token expired).
_RESTART: Final[builtins.list[dict[str, Any]]] = []
_DONE: Final = object()


def _buffered(pages: Iterator[builtins.list[dict[str, Any]]], size: int) -> Iterator[builtins.list[dict[str, Any]]]:
    """``pages`` read ahead by a thread, at most ``size`` pages held; its errors are raised here.
    Closing the iterator early stops the thread at its next page."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for page in pages:
                if not put(page):
                    return
            put(_DONE)
        except BaseException as err:  # handed to the consumer, raised there
            put(err)

    thread = threading.Thread(target=run, name="kubeapi-pager", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _own_retries(api_client: Any) -> None:
    """urllib3, under the ``kubernetes`` client, retries 429/503 answers with a Retry-After itself
    (three times, for PUT and DELETE too, sleeping as long as the server says): the retries here
    replace that (GETs only, bounded waits); urllib3 keeps retrying a refused connection twice."""
    import urllib3

    pool_manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool_manager is None:
        return
    pool_manager.connection_pool_kw["retries"] = urllib3.Retry(
        total=None,
        connect=2,
        read=0,
        redirect=0,
        status=0,
        other=0,
        respect_retry_after_header=False,
        raise_on_status=False,
    )
    pool_manager.clear()  # pools already made keep their old settings


def _cause(err: BaseException) -> str:
    """The innermost reason urllib3 wraps (MaxRetryError hides the refused connection)."""
    reason = getattr(err, "reason", None)
    if isinstance(reason, BaseException):
        return _cause(reason)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
