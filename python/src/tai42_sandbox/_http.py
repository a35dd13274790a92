"""The HTTP side of the client: the daemon's URL, one aiohttp session (its
connection pool) per client, and the one place where a request's failure
becomes the contract's error."""

from __future__ import annotations

import os
import ssl as _ssl
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp.payload import BytesPayload
from yarl import URL

from tai42_contract.sandbox import SandboxError

from ._wire import error_from_wire, from_json, to_json

DEFAULT_URL: Final = "http://127.0.0.1:4242"
# How many keep-alive connections the pool keeps to the daemon, so that
# parallel calls reuse connections (the Go client's MaxIdleConnsPerHost).
POOL_SIZE: Final = 64
# The most of an error answer that is read.
MAX_ERROR_BODY: Final = 1 << 20

_JSON: Final = "application/json"


def session_path(session_id: str, rest: str = "") -> str:
    """/v1/sessions/{id}[/rest] with id escaped."""
    p = "/v1/sessions/" + quote(session_id, safe="")
    return p + "/" + rest if rest else p


class Endpoint:
    """Where the daemon is: a base URL for aiohttp, the socket of a unix:
    URL, and the text error messages name it by (never a password)."""

    base: str
    unix_path: str
    display: str

    def __init__(self, raw: str) -> None:
        if "://" not in raw and not raw.startswith("unix:"):
            raw = "http://" + raw  # "127.0.0.1:4242", as the CLI accepts it
        if raw.startswith("unix:"):
            path = raw[len("unix:") :]
            if path.startswith("//"):
                path = urlsplit(raw).path
            if not path:
                raise SandboxError(
                    f"the daemon URL {raw!r} names no socket (want unix:/path/to.sock)", op="client"
                )
            self.unix_path, self.base, self.display = path, "http://unix", "unix:" + path
            return
        try:
            u = urlsplit(raw)
            host = u.hostname
            port = u.port
        except ValueError as e:
            raise SandboxError(
                "the daemon URL is not valid (want http://host:port, https://host:port or "
                f"unix:/path/to.sock): {e}",
                op="client",
            ) from None
        if u.scheme not in ("http", "https"):
            raise SandboxError(
                f"the daemon URL scheme {u.scheme!r} is not http, https or unix", op="client"
            )
        if not host:
            raise SandboxError("the daemon URL names no host", op="client")
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc += f":{port}"
        self.unix_path = ""
        self.base = f"{u.scheme}://{netloc}{u.path.rstrip('/')}"
        self.display = self.base


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("TAI42_URL") or DEFAULT_URL


def resolve_token(token: str | None) -> str:
    return token if token is not None else os.environ.get("TAI42_TOKEN", "")


class Transport:
    """One aiohttp session to the daemon and the request helpers every call
    goes through."""

    def __init__(self, endpoint: Endpoint, token: str, ssl: _ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self.display = endpoint.display
        self._token = token
        self._ssl = ssl
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never the token
        return f"Transport({self.display})"

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            raise SandboxError(
                "the client is not connected: use `async with Tai42Sandbox(...)` or "
                "`await sb.connect()` first",
                op="client",
            )
        return self._http

    def open(self) -> None:
        """Makes the session (which needs the running loop); no I/O."""
        if self._http is not None and not self._http.closed:
            return
        connector: aiohttp.BaseConnector
        if self.endpoint.unix_path:
            connector = aiohttp.UnixConnector(path=self.endpoint.unix_path, limit=POOL_SIZE)
        else:
            connector = aiohttp.TCPConnector(
                limit=POOL_SIZE, ssl=self._ssl if self._ssl is not None else True
            )
        # identity: the client reads bodies as sent (auto_decompress off, so a
        # file is never inflated twice), so it must not ask a proxy for gzip.
        headers = {"Accept": _JSON, "Accept-Encoding": "identity"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        self._http = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            raise_for_status=False,
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def url(self, path: str) -> str:
        return self.endpoint.base + path

    def parsed_url(self, path: str) -> URL:
        """url(path) parsed, for a URL a caller keeps (a session's exec
        URL), which aiohttp then does not parse again on every request.
        The base parsed at connect, so this does not fail."""
        return URL(self.url(path))

    def unreachable(self, op: str, err: BaseException) -> SandboxError:
        """The error of a request that got no answer."""
        if isinstance(err, aiohttp.ClientConnectorError):
            why = err.os_error.strerror or str(err.os_error) or type(err.os_error).__name__
            return SandboxError(f"cannot reach the daemon at {self.display}: {why}", op=op)
        why = str(err) or type(err).__name__
        return SandboxError(
            f"the connection to the daemon at {self.display} broke before it answered "
            f"({why}); whether the {op} took effect is unknown",
            op=op,
        )

    async def request(
        self,
        op: str,
        method: str,
        path: str | URL,
        *,
        params: Mapping[str, str] | None = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """Sends a request and returns its 2xx answer, unread (the caller
        releases it); any other answer is decoded into its error. path is
        a path on the daemon or a URL from :meth:`parsed_url`."""
        url = path if isinstance(path, URL) else self.url(path)
        try:
            resp = await self.http.request(method, url, params=params, data=data, headers=headers)
        except aiohttp.ClientError as e:
            raise self.unreachable(op, e) from None
        if 200 <= resp.status < 300:
            return resp
        try:
            raise await self.response_error(op, resp)
        finally:
            resp.release()

    async def response_error(self, op: str, resp: aiohttp.ClientResponse) -> SandboxError:
        """The error of a non-2xx answer: an API error body becomes the
        contract's error with every field, anything else a SandboxError
        naming the status."""
        try:
            body = await resp.content.read(MAX_ERROR_BODY)
        except aiohttp.ClientError as e:
            return self.unreachable(op, e)
        try:
            wire = from_json(body)["error"]
            if isinstance(wire, dict) and wire.get("kind"):
                return error_from_wire(wire)
        except (ValueError, KeyError, TypeError):
            pass
        return SandboxError(
            f"the daemon at {self.display} answered {resp.status} {resp.reason or ''}".rstrip()
            + ", which is not an API error body",
            op=op,
        )

    async def call(
        self,
        op: str,
        method: str,
        path: str | URL,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """A JSON request (body, if not None) and its JSON answer (None for
        an empty one)."""
        # A payload made here carries its Content-Type, which spares
        # aiohttp a lookup of the payload type and a merge of headers.
        data = None if body is None else BytesPayload(to_json(body).encode(), content_type=_JSON)
        resp = await self.request(op, method, path, params=params, data=data)
        try:
            raw = await resp.read()
        except aiohttp.ClientError as e:
            raise self.unreachable(op, e) from None
        finally:
            resp.release()
        if not raw:
            return None
        try:
            return from_json(raw)
        except ValueError:
            raise SandboxError(
                f"the daemon at {self.display} answered {resp.status} with a body that is not "
                "the expected JSON",
                op=op,
            ) from None
