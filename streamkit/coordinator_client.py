"""A thin async HTTP client for the coordinator's /coord/v1 API.

It only moves wire models over HTTP; every protocol decision lives in
``streamkit.consumer.member`` (consumers) and ``streamkit.publisher.routing_cache`` (producers).

Credentials: a user and password are traded for a bearer token at
``POST /coord/v1/auth/login`` on first use; a configured token is used as is.
A 401 mid-run (the token expired, or the coordinators' signing secret was
rotated) makes the client log in again, once, and repeat the request, so a
long-running process survives it instead of exiting.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Generator
from typing import Final, TypeVar
from urllib.parse import quote

import anyio
import httpx

from streamkit.closing import AsyncClosing
from streamkit.errors import StreamkitError
from streamkit.protocol import (
    API_PREFIX,
    ErrorResponse,
    GroupListResponse,
    GroupResponse,
    HeartbeatAnswer,
    HeartbeatRequest,
    LoginResponse,
    MemberListResponse,
    ProducerRoutingResponse,
    StreamShardOffsetsResponse,
    WireModel,
)
from streamkit.settings import StreamKitSettings, set_where

M = TypeVar("M", bound=WireModel)
log = logging.getLogger("streamkit.coordinator")


#: The largest answer read from a coordinator: a listing of 10,000 shards is
#: a few MB; anything far beyond is a broken or hostile server, and reading it
#: whole would only exhaust this process's memory.
MAX_ANSWER_BYTES: Final = 16 * 1024 * 1024


class CoordinatorError(StreamkitError):
    """The coordinator answered with an error (an ``ErrorResponse``)."""

    def __init__(self, status_code: int, error_code: str | None, message: str) -> None:
        super().__init__(f"coordinator answered {status_code} {error_code or ''}: {message}")
        self.status_code = status_code
        self.error_code = error_code


class CoordinatorUnavailable(StreamkitError):
    """The coordinator could not be reached or did not answer in time."""


def _segment(value: str) -> str:
    return quote(value, safe="")


class _CoordinatorAuth(httpx.Auth):
    """Bearer tokens, obtained (and renewed on a 401) through the login endpoint."""

    requires_response_body = True

    def __init__(self, username: str | None, password: str | None, token: str | None) -> None:
        self._credentials: tuple[str, str] | None = (
            (username, password) if username and password else None
        )
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        fresh = False
        if self._token is None and self._credentials is not None:
            yield from self._login(request)
            fresh = True
        self._authorize(request)
        response = yield request
        if response.status_code != 401 or fresh or self._credentials is None:
            return
        log.warning(
            "coordinator refused our bearer token (%s); logging in again",
            _error_text(response),
        )
        yield from self._login(request)
        self._authorize(request)
        yield request

    def _authorize(self, request: httpx.Request) -> None:
        if self._token is not None:
            request.headers["Authorization"] = f"Bearer {self._token}"
        elif self._credentials is not None:
            # The login failed (a 503 from a terminating coordinator, say):
            # Basic credentials still get this request its real answer.
            pair = ":".join(self._credentials).encode()
            request.headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"

    def _login(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        assert self._credentials is not None
        # Keep whatever path a proxy puts in front of the API.
        mount = request.url.path.partition(API_PREFIX)[0]
        url = request.url.copy_with(path=f"{mount}{API_PREFIX}/auth/login", query=None)
        username, password = self._credentials
        login = httpx.Request("POST", url, json={"username": username, "password": password})
        response = yield login
        if response.status_code in _FINAL_LOGIN_ANSWERS:
            # Wrong credentials (or too many of them): sending them again as
            # Basic would only count one more failed login against this name
            # and address, and earn the same answer; the call fails with it.
            self._token = None
            raise _error(response)
        if response.status_code != 200:
            self._token = None
            log.warning("coordinator login failed: %s", _error_text(response))
            return
        try:
            self._token = LoginResponse.from_wire(response.content).access_token
        except ValueError:
            self._token = None
            log.error("coordinator login answered something unreadable")


def _error_text(response: httpx.Response) -> str:
    try:
        err = ErrorResponse.from_wire(response.content)
        text = f"{response.status_code} {err.error_code}: {err.message}"
    except ValueError:
        return _not_a_coordinator(response)  # one line, not a page of HTML
    hint = _HINTS.get(response.status_code)
    return f"{text} ({hint})" if hint else text


class CoordinatorClient(AsyncClosing):
    """One keep-alive connection pool to the coordinator, shared by a process."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self._max_answer_bytes = max_answer_bytes
        auth: httpx.Auth | None = None
        if token or (username and password):
            auth = _CoordinatorAuth(username, password, token)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            auth=auth,
            timeout=timeout,
            transport=transport,
        )

    @classmethod
    def from_settings(cls, settings: StreamKitSettings) -> CoordinatorClient:
        return cls(
            settings.coordinator_url,
            username=settings.coordinator_username,
            password=(
                settings.coordinator_password.get_secret_value()
                if settings.coordinator_password
                else None
            ),
            token=(
                settings.coordinator_token.get_secret_value()
                if settings.coordinator_token
                else None
            ),
            timeout=settings.coordinator_timeout,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- calls -------------------------------------------------------------------

    @staticmethod
    def group_path(stream_prefix: str, consumer_group: str) -> str:
        return f"{API_PREFIX}/streams/{_segment(stream_prefix)}/groups/{_segment(consumer_group)}"

    async def get_group(self, stream_prefix: str, consumer_group: str) -> GroupResponse:
        return await self._call(
            "GET", self.group_path(stream_prefix, consumer_group), GroupResponse
        )

    async def get_routing(self, stream_prefix: str, consumer_group: str) -> ProducerRoutingResponse:
        path = self.group_path(stream_prefix, consumer_group) + "/producer-routing"
        return await self._call("GET", path, ProducerRoutingResponse)

    async def heartbeat(
        self, stream_prefix: str, consumer_group: str, request: HeartbeatRequest
    ) -> HeartbeatAnswer:
        path = (
            self.group_path(stream_prefix, consumer_group)
            + f"/members/{_segment(request.member_id)}/heartbeat"
        )
        return await self._call("POST", path, HeartbeatAnswer, body=request)

    # -- monitoring (READ role): ``streamkit status`` and error hints --------------

    async def list_groups(self) -> GroupListResponse:
        return await self._call("GET", f"{API_PREFIX}/monitoring/groups", GroupListResponse)

    def _monitoring_path(self, stream_prefix: str, consumer_group: str) -> str:
        return (
            f"{API_PREFIX}/monitoring"
            + self.group_path(stream_prefix, consumer_group)[len(API_PREFIX) :]
        )

    async def list_members(self, stream_prefix: str, consumer_group: str) -> MemberListResponse:
        path = self._monitoring_path(stream_prefix, consumer_group) + "/members"
        return await self._call("GET", path, MemberListResponse)

    async def get_offsets(
        self, stream_prefix: str, consumer_group: str
    ) -> StreamShardOffsetsResponse:
        path = self._monitoring_path(stream_prefix, consumer_group) + "/offsets"
        return await self._call("GET", path, StreamShardOffsetsResponse)

    async def _send(self, method: str, path: str, body: WireModel | None) -> httpx.Response:
        request = self._http.build_request(
            method, path, json=body.to_wire(exclude_none=True) if body else None
        )
        try:
            streamed = await self._http.send(request, stream=True)
            try:
                content = await _read_bounded(streamed, self._max_answer_bytes, method, path)
            finally:
                await streamed.aclose()
        except httpx.HTTPError as exc:
            raise CoordinatorUnavailable(
                _unreachable(self._http.base_url, method, path, exc)
            ) from exc
        return httpx.Response(streamed.status_code, content=content, request=request)

    async def _call(
        self, method: str, path: str, model: type[M], *, body: WireModel | None = None
    ) -> M:
        response = await self._send(method, path, body)
        if method == "GET" and _redis_blip(response):
            # A coordinator whose Redis just restarted fails the first command
            # on each stale pooled connection (and reconnects it); it asks to
            # retry in a second.  A read is safe to repeat once.
            await anyio.sleep(_RETRY_AFTER_S)
            response = await self._send(method, path, body)
        if response.status_code >= 400:
            raise _error(response)
        try:
            return model.from_wire(response.content)
        except ValueError as exc:
            raise CoordinatorError(
                response.status_code, "BAD_RESPONSE", f"unreadable answer to {method} {path}"
            ) from exc


def _redis_blip(response: httpx.Response) -> bool:
    if response.status_code != 503:
        return False
    try:
        return ErrorResponse.from_wire(response.content).error_code == "REDIS_UNAVAILABLE"
    except ValueError:
        return False


async def _read_bounded(response: httpx.Response, limit: int, method: str, path: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(response.status_code, method, path, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(response.status_code, method, path, limit)
        chunks.append(chunk)
    return b"".join(chunks)


class AnswerTooLarge(CoordinatorError):
    """The coordinator's answer exceeded ``max_answer_bytes`` (not read further)."""

    def __init__(self, status_code: int, method: str, path: str, limit: int) -> None:
        super().__init__(
            status_code,
            "ANSWER_TOO_LARGE",
            f"the answer to {method} {path} is over {limit // (1024 * 1024)} MiB; "
            "is STREAMKIT_COORDINATOR_URL pointing at a streamkit coordinator?",
        )


def _unreachable(base_url: httpx.URL, method: str, path: str, exc: httpx.HTTPError) -> str:
    # Name the address and the setting: the usual cause is a coordinator that
    # is not running, or a client pointed at the wrong place.
    what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "is unreachable"
    detail = str(exc) or type(exc).__name__
    where = set_where("STREAMKIT_COORDINATOR_URL")
    return (
        f"the coordinator at {base_url} {what} ({method} {path}: {detail}); "
        "is streamkit-server running there? STREAMKIT_COORDINATOR_URL sets the address"
        + (f" (here it comes from {where})" if where else "")
    )


#: How long a read waits before its one retry of a ``503 REDIS_UNAVAILABLE``
#: (the coordinator's ``Retry-After``).
_RETRY_AFTER_S: Final = 1.0

#: What to do when the coordinator's Redis does not answer.
_REDIS_DOWN_HINT: Final = (
    "the coordinator cannot reach its Redis: is redis-server running there? "
    "STREAMKIT_SERVER_REDIS_URL sets the coordinator's; retry once it is back"
)

#: Login answers that end the call: the request itself would be refused the same way.
_FINAL_LOGIN_ANSWERS = (401, 429)

#: What to do about a refused call, by status (appended to the server's message).
_HINTS = {
    401: "set STREAMKIT_COORDINATOR_USERNAME and STREAMKIT_COORDINATOR_PASSWORD "
    "(or STREAMKIT_COORDINATOR_TOKEN) to credentials the coordinator accepts",
    403: "the credentials are valid but lack the role this call needs",
}


def _error(response: httpx.Response) -> StreamkitError:
    if response.status_code in (502, 503, 504):
        # Terminating or overloaded coordinators answer 503: try another one later.
        try:
            err = ErrorResponse.from_wire(response.content)
            detail = f"{err.error_code}: {err.message}"
            if err.error_code == "REDIS_UNAVAILABLE":
                detail = f"{detail.rstrip('.')} ({_REDIS_DOWN_HINT})"
        except ValueError:
            detail = response.text[:200]
        return CoordinatorUnavailable(f"coordinator answered {response.status_code}: {detail}")
    hint = _HINTS.get(response.status_code)
    try:
        err = ErrorResponse.from_wire(response.content)
        code, message = err.error_code, err.message or ""
    except ValueError:
        # Every refusal of a coordinator is an ErrorResponse: this is some
        # other server (a 404 here is not "no such group"), or a proxy's own
        # page; like an unreachable coordinator, not like its refusal.
        return CoordinatorUnavailable(_not_a_coordinator(response))
    if hint:
        message = f"{message} ({hint})"
    return CoordinatorError(response.status_code, code, message)


def _not_a_coordinator(response: httpx.Response) -> str:
    url = response.request.url
    where = url.copy_with(path="/", query=None)
    return (
        f"the server at {str(where).rstrip('/')} answered {response.status_code} to "
        f"{response.request.method} {url.path} without a coordinator's error answer: it is "
        "not a streamkit coordinator (or a proxy does not route that path); "
        "STREAMKIT_COORDINATOR_URL sets the address"
    )
