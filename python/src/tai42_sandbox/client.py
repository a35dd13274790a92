"""Tai42Sandbox: the contract's Sandbox served by a tai42 daemon over its
HTTP API, and Tai42Session, one of its sessions."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import ssl as _ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from aiohttp.payload import BytesPayload
from pydantic import SecretStr, ValidationError

from tai42_contract.sandbox import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxExecHandle,
    SandboxImageInfo,
    SandboxPolicy,
    SandboxPruneResult,
    SandboxPullProgress,
    SandboxSession,
    SandboxSessionInfo,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxWorkspaceInfo,
)
from tai42_contract.sandbox.models import valid_workspace_key

from ._exec import MAX_FRAME, Tai42ExecHandle, session_gone_checker
from ._files import BytesBody, FileSource, SourceFailed, Tai42FileReader, UploadPayload
from ._http import Endpoint, Transport, resolve_token, resolve_url, session_path
from ._wire import (
    EXEC_SUBPROTOCOL,
    MAX_JSON_BODY,
    NDJSON,
    TRAILER_UPLOAD_FAILED,
    error_from_wire,
    from_json,
    result_from_wire,
    reveal,
    to_json,
    valid_bytes,
    valid_timeout,
)

_OCTETS: Final = {"Content-Type": "application/octet-stream"}
_JSON: Final = {"Content-Type": "application/json"}
PullProgressCallback = Callable[[SandboxPullProgress], "Awaitable[None] | None"]
"""What pull_image calls with each event: a function, or a coroutine
function (awaited before the next event is read)."""

# The JSON body of an exec without its stdin, past which an exec goes over
# the stream: what the base64 of stdin adds is 4 bytes per 3.
_STDIN_FIELD: Final = len(',"stdin_base64":""')


def _argv(op: str, argv: Sequence[str]) -> list[str]:
    if isinstance(argv, (str, bytes)):
        raise SandboxError(
            f"argv must be a list of strings, not a {type(argv).__name__}: "
            'write ["sh", "-c", command] to run a shell line',
            op=op,
        )
    out = list(argv)
    if not out:
        raise SandboxError("argv is empty: name a command to run", op=op)
    for a in out:
        if not isinstance(a, str):
            raise SandboxError(f"argv holds a {type(a).__name__}; every item must be a str", op=op)
    return out


def _exec_body(
    argv: list[str],
    cwd: str | None,
    env: Mapping[str, SecretStr | str] | None,
    timeout: float,
    user: str | None,
) -> dict[str, Any]:
    d: dict[str, Any] = {"argv": argv, "timeout_seconds": timeout}
    if cwd:
        d["cwd"] = cwd
    plain = reveal(env)
    if plain:
        d["env"] = plain
    if user:
        d["user"] = user
    return d


class Tai42Session(SandboxSession):
    """One session of the daemon. ``id`` and ``workspace_path`` are the ones
    the daemon returned; every method asks the daemon. Once destroyed
    through this object, a call raises SandboxSessionNotFoundError without
    a request."""

    def __init__(self, sb: Tai42Sandbox, info: SandboxSessionInfo) -> None:
        self._sb = sb
        self.id = info.id
        self.workspace_path = info.workspace_path
        self._destroyed = False
        # Built once: escaping the id and parsing the URL cost about a
        # fiftieth of an exec's instructions in the client.
        self._exec_url = sb._t.parsed_url(self._path("exec"))

    def __repr__(self) -> str:
        return f"<Tai42Session {self.id}{' destroyed' if self._destroyed else ''}>"

    def _live(self) -> Transport:
        if self._destroyed:
            raise SandboxSessionNotFoundError(self.id, "it was destroyed through this client")
        return self._sb._transport_ready()

    def _path(self, rest: str = "") -> str:
        return session_path(self.id, rest)

    async def info(self) -> SandboxSessionInfo:
        t = self._live()
        return SandboxSessionInfo.model_validate(await t.call("info", "GET", self._path()))

    async def touch(self) -> None:
        await self._live().call("touch", "POST", self._path("touch"))

    async def destroy(self) -> None:
        """Tears the session down; a no-op once it is gone."""
        if self._destroyed:
            return
        await self._sb.destroy_session(self.id)
        self._destroyed = True

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | Mapping[str, SecretStr | str] | None = None,
        stdin: bytes | None = None,
        timeout_seconds: float,
        user: str | None = None,
    ) -> ExecResult:
        """Runs argv to completion; a non-zero exit is a result. A timeout is
        SandboxExecTimeoutError with the daemon's lengths, too much output
        SandboxOutputLimitError. stdin too large for the daemon's JSON body
        limit goes over the exec stream instead (with no output limit)."""
        op = "exec"
        t = self._live()
        args = _argv(op, argv)
        timeout = valid_timeout(op, timeout_seconds, self._sb._default_timeout())
        data = None if stdin is None else valid_bytes(op, "stdin", stdin)
        body = _exec_body(args, cwd, env, timeout, user)
        if data is not None:
            raw = to_json(body).encode()
            if len(raw) + _STDIN_FIELD + (len(data) + 2) // 3 * 4 > self._sb._json_limit():
                return await self._exec_streamed(args, cwd, env, timeout, user, data)
            body["stdin_base64"] = base64.b64encode(data).decode()
        res = await t.call(op, "POST", self._exec_url, body)
        try:
            return result_from_wire(res)
        except ValueError as e:
            raise SandboxError(
                f"the daemon's result holds output that is not valid base64: {e}", op=op
            ) from None

    async def _exec_streamed(
        self,
        argv: list[str],
        cwd: str | None,
        env: Mapping[str, SecretStr | str] | None,
        timeout: float,
        user: str | None,
        stdin: bytes,
    ) -> ExecResult:
        h = await self.exec_start(argv, cwd=cwd, env=env, timeout_seconds=timeout, user=user)
        out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

        async def feed() -> None:
            try:
                await h.write_stdin(stdin)
                await h.close_stdin()
            except SandboxError:
                pass  # an exec that ends without reading it all: its end says how

        writer = asyncio.get_running_loop().create_task(feed())
        code: int | None = None
        try:
            async for item in h.output:
                if isinstance(item, SandboxStreamChunk):
                    out[item.stream].append(item.data)
                else:
                    code = item.exit_code
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            await h.kill()
        assert code is not None  # output ends with the exit or raises
        return ExecResult(
            exit_code=code,
            stdout=b"".join(out["stdout"]).decode("utf-8", "surrogateescape"),
            stderr=b"".join(out["stderr"]).decode("utf-8", "surrogateescape"),
        )

    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | Mapping[str, SecretStr | str] | None = None,
        timeout_seconds: float,
        user: str | None = None,
    ) -> Tai42ExecHandle:
        """Starts argv as an interactive exec over a WebSocket and returns
        once the daemon says it runs, or raises the error it answered (an
        unknown session, a bad argv, cwd or timeout)."""
        op = "exec_start"
        t = self._live()
        args = _argv(op, argv)
        timeout = valid_timeout(op, timeout_seconds, self._sb._default_timeout())
        start = _exec_body(args, cwd, env, timeout, user)
        start = {"type": "start", **start}
        try:
            ws = await t.http.ws_connect(
                t.url(self._path("exec/stream")),
                protocols=(EXEC_SUBPROTOCOL,),
                max_msg_size=MAX_FRAME,
                autoclose=True,
                autoping=True,
            )
        except aiohttp.WSServerHandshakeError as e:
            raise await self._refused(t, op, e) from None
        except aiohttp.ClientError as e:
            raise t.unreachable(op, e) from None
        try:
            if ws.protocol != EXEC_SUBPROTOCOL:
                raise SandboxError(
                    f"the daemon at {t.display} did not agree to the exec stream's subprotocol "
                    f"{EXEC_SUBPROTOCOL}",
                    op=op,
                )
            await ws.send_str(to_json(start))
            msg = await ws.receive()
            f = self._first_frame(t, op, msg)
        except BaseException as e:
            await ws.close()
            if isinstance(e, (aiohttp.ClientError, ConnectionError)):
                raise SandboxError(
                    f"the exec stream to the daemon at {t.display} broke before the exec "
                    f"started: {e}",
                    op=op,
                ) from None
            raise
        if f.get("type") == "error":
            await ws.close()
            err = f.get("error")
            if not isinstance(err, dict):
                raise SandboxError(
                    f"the daemon at {t.display} refused the exec without saying why", op=op
                )
            raise error_from_wire(err)
        return self._sb._register(self.id, ws)

    @staticmethod
    def _first_frame(t: Transport, op: str, msg: Any) -> dict[str, Any]:
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise SandboxError(
                f"the exec stream from the daemon at {t.display} broke before the exec started",
                op=op,
            )
        try:
            f = json.loads(msg.data)
        except ValueError:
            f = None
        if not isinstance(f, dict) or f.get("type") not in ("started", "error"):
            raise SandboxError(
                f"the daemon at {t.display} answered the start frame with a malformed frame; "
                'want "started" or "error"',
                op=op,
            )
        return f

    async def _refused(
        self, t: Transport, op: str, e: aiohttp.WSServerHandshakeError
    ) -> SandboxError:
        # aiohttp drops the body of a refused handshake: the session's own
        # route answers the same refusal (a token, a gone session, a
        # stopping daemon) with its error body.
        try:
            await t.call(op, "GET", self._path())
        except SandboxError as err:
            return err
        return SandboxError(
            f"the daemon at {t.display} refused the exec stream's WebSocket handshake "
            f"({e.status} {e.message})",
            op=op,
        )

    async def put_file(self, path: str, data: bytes) -> None:
        """Writes data to path (workspace-relative by default)."""
        op = "put_file"
        t = self._live()
        data = valid_bytes(op, "data", data)
        resp = await t.request(
            op,
            "PUT",
            self._path("files"),
            params={"path": path},
            data=BytesBody(data),
            headers=_OCTETS,
        )
        resp.release()

    async def put_file_from(self, path: str, source: FileSource) -> None:
        """Streams everything source yields to path as one chunked PUT,
        without holding it in memory. source is an async iterable of bytes,
        a binary file object, or an object with an async read(). When the
        source fails midway the daemon fails the put and keeps the old
        content, and a SandboxError whose cause is the source's error is
        raised."""
        op = "put_file"
        t = self._live()
        if not isinstance(source, (str, bytes)) and not (
            hasattr(source, "__aiter__") or hasattr(source, "read")
        ):
            raise SandboxError(
                f"source must be an async iterable of bytes or a binary file object, got "
                f"{type(source).__name__}",
                op=op,
            )
        if isinstance(source, (bytes, bytearray, memoryview)):
            return await self.put_file(path, bytes(source))
        if isinstance(source, str):
            raise SandboxError("source must be bytes, not str (encode text first)", op=op)
        body = UploadPayload(source)
        try:
            resp = await t.request(
                op,
                "PUT",
                self._path("files"),
                params={"path": path},
                data=body,
                headers={**_OCTETS, "Trailer": TRAILER_UPLOAD_FAILED},
            )
        except SandboxError as err:
            if body.failed is not None:
                raise self._source_failed(op, body.failed) from body.failed
            cause = err.__context__
            if isinstance(cause, SourceFailed):
                raise self._source_failed(op, cause.cause) from cause.cause
            raise
        resp.release()
        if body.failed is not None:
            raise self._source_failed(op, body.failed) from body.failed

    @staticmethod
    def _source_failed(op: str, cause: BaseException) -> SandboxError:
        return SandboxError(
            f"reading the data to write failed ({type(cause).__name__}: {cause}); the file "
            "keeps its old content",
            op=op,
        )

    async def get_file(self, path: str) -> bytes:
        """Reads path. SandboxFileNotFoundError only when nothing exists
        there; any other failure a SandboxError with the daemon's message."""
        op = "get_file"
        t = self._live()
        resp = await t.request(op, "GET", self._path("files"), params={"path": path})
        try:
            data = await resp.read()
        except aiohttp.ClientError as e:
            raise SandboxError(
                f"the download of {path!r} from the daemon at {t.display} broke off: {e}", op=op
            ) from None
        finally:
            resp.release()
        return data

    def open_file(self, path: str) -> _OpenFile:
        """A streamed read of path: ``async with s.open_file(p) as f`` gives
        a Tai42FileReader, an async iterator of bytes chunks. Errors (a
        missing file, a directory, a gone session) are raised on entry."""
        return _OpenFile(self, path)


class _OpenFile:
    def __init__(self, s: Tai42Session, path: str) -> None:
        self._s = s
        self._path = path
        self._reader: Tai42FileReader | None = None

    async def __aenter__(self) -> Tai42FileReader:
        op = "get_file"
        t = self._s._live()
        resp = await t.request(op, "GET", self._s._path("files"), params={"path": self._path})
        self._reader = Tai42FileReader(t, op, self._path, resp)
        return self._reader

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            await self._reader.aclose()


class Tai42Sandbox(Sandbox):
    """The contract's Sandbox served by a tai42 daemon.

    url is ``http://host:port``, ``https://host:port`` or ``unix:/path``
    (default $TAI42_URL, else http://127.0.0.1:4242); token the bearer
    token (default $TAI42_TOKEN). Use it as ``async with Tai42Sandbox() as
    sb`` or ``await sb.connect()`` ... ``await sb.aclose()``: connect asks
    the daemon for its defaults (GET /v1/sandbox), so that an unreachable
    daemon or a refused token is known at once. Calls share one pool of
    keep-alive connections. Closing never destroys a session; it drops the
    exec streams still open, which ends their execs.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._endpoint = Endpoint(resolve_url(url))
        self._t = Transport(self._endpoint, resolve_token(token), ssl)
        self._info: dict[str, Any] | None = None
        self._handles: dict[Tai42ExecHandle, None] = {}
        self._connect_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:  # never the token
        return f"<Tai42Sandbox {self._t.display}>"

    @property
    def url(self) -> str:
        """The daemon's URL, as error texts name it."""
        return self._t.display

    async def connect(self) -> None:
        """Opens the connection pool and reads the daemon's defaults; again
        is a no-op."""
        if self._info is not None and self._t._http is not None:
            return
        self._t.open()
        try:
            info = await self._t.call("connect", "GET", "/v1/sandbox")
        except BaseException:
            await self._t.close()
            raise
        if not isinstance(info, dict):
            await self._t.close()
            raise SandboxError(f"the daemon at {self.url} answered no sandbox info", op="connect")
        self._info = info

    async def aclose(self) -> None:
        """Drops the exec streams still open and closes the pool; sessions
        stay. Safe to call more than once."""
        hs = list(self._handles)
        await asyncio.gather(*(h.aclose() for h in hs), return_exceptions=True)
        await self._t.close()

    async def __aenter__(self) -> Tai42Sandbox:
        await self.connect()
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _transport_ready(self) -> Transport:
        if self._info is None:
            raise SandboxError(
                "the client is not connected: use `async with Tai42Sandbox(...)` or "
                "`await sb.connect()` first",
                op="client",
            )
        _ = self._t.http  # raises once closed
        return self._t

    def _field(self, name: str) -> Any:
        if self._info is None:
            raise SandboxError(f"{name} is known once connected (await sb.connect())", op="client")
        return self._info.get(name)

    def _default_timeout(self) -> float | None:
        return (
            None if self._info is None else float(self._info.get("exec_default_timeout_seconds", 0))
        )

    def _json_limit(self) -> int:
        mb = self._info.get("max_body_bytes", 0) if self._info else 0
        return min(int(mb), MAX_JSON_BODY) if mb else MAX_JSON_BODY

    @property
    def exec_default_timeout_seconds(self) -> float:  # type: ignore[override]
        """The daemon's default for one short exec, from connect."""
        return float(self._field("exec_default_timeout_seconds") or 0)

    @property
    def reap_interval_seconds(self) -> float:  # type: ignore[override]
        """The daemon's reap sweep cadence, from connect."""
        return float(self._field("reap_interval_seconds") or 0)

    @property
    def provider(self) -> str:
        """The daemon's provider ("host", "container"), from connect."""
        return str(self._field("provider") or "")

    @property
    def max_body_bytes(self) -> int:
        """The daemon's largest request body, from connect."""
        return int(self._field("max_body_bytes") or 0)

    @property
    def version(self) -> str:
        return str(self._field("version") or "")

    async def policy(self) -> SandboxPolicy:
        """The policy the daemon enforces (GET /v1/policy)."""
        t = self._transport_ready()
        return SandboxPolicy.model_validate(await t.call("policy", "GET", "/v1/policy"))

    async def create_session(self, spec: SandboxSessionSpec) -> Tai42Session:
        """Asks the daemon for a session. A spec it cannot honour is a
        SandboxSpecRejectedError with its field and reason."""
        from ._wire import spec_to_wire

        t = self._transport_ready()
        if not isinstance(spec, SandboxSessionSpec):
            spec = SandboxSessionSpec.model_validate(spec)  # a bad one is rejected here
        info = await t.call("create_session", "POST", "/v1/sessions", spec_to_wire(spec))
        return Tai42Session(self, SandboxSessionInfo.model_validate(info))

    async def get_session(self, session_id: str) -> Tai42Session:
        t = self._transport_ready()
        if not session_id:
            raise SandboxSessionNotFoundError(session_id)
        info = await t.call("get_session", "GET", session_path(session_id))
        return Tai42Session(self, SandboxSessionInfo.model_validate(info))

    async def list_sessions(self) -> list[SandboxSessionInfo]:
        t = self._transport_ready()
        body = await t.call("list_sessions", "GET", "/v1/sessions")
        return [SandboxSessionInfo.model_validate(s) for s in (body or {}).get("sessions") or []]

    async def destroy_session(self, session_id: str) -> None:
        """Tears a session down; a no-op on an unknown or gone id."""
        t = self._transport_ready()
        if not session_id:
            return
        await t.call("destroy_session", "DELETE", session_path(session_id))
        self._session_gone(session_id)

    async def reap(self) -> list[str]:
        t = self._transport_ready()
        body = await t.call("reap", "POST", "/v1/reap")
        ids = [str(i) for i in (body or {}).get("reaped") or []]
        for i in ids:
            self._session_gone(i)
        return ids

    async def list_workspaces(self) -> list[SandboxWorkspaceInfo]:
        """The daemon's persistent workspaces, sorted by key, each with the
        id of the live session holding it."""
        t = self._transport_ready()
        body = await t.call("list_workspaces", "GET", "/v1/workspaces")
        return [
            SandboxWorkspaceInfo.model_validate(w) for w in (body or {}).get("workspaces") or []
        ]

    async def remove_workspace(self, key: str) -> None:
        """Deletes a persistent workspace and its files. One a live session
        holds is a SandboxSpecRejectedError (reason conflict); a key with no
        workspace a SandboxWorkspaceNotFoundError; an invalid key is refused
        without a request."""
        op = "remove_workspace"
        t = self._transport_ready()
        bad = valid_workspace_key(key) if isinstance(key, str) else "workspace_key must be a str"
        if bad:
            raise SandboxError(f"{bad}; no workspace can have it", op=op)
        await t.call(op, "DELETE", "/v1/workspaces/" + quote(key, safe=""))

    async def pull_image(
        self,
        ref: str,
        *,
        platform: str | None = None,
        progress: PullProgressCallback | None = None,
    ) -> SandboxImageInfo:
        """Pulls ref ("python:3.12-slim", "ghcr.io/o/r:tag",
        "host:5000/r@sha256:...") into the daemon's store and returns the
        image, calling progress with each event of the pull, in order (a
        "fetching" event not read in time arrives merged into the next of
        its layer).
        platform ("os/arch[/variant]") picks from a multi-platform image;
        None is the daemon's own. A failed pull is a SandboxImagePullError
        with its reason ("invalid_reference" for a reference that is not
        one); a daemon whose provider keeps no images raises a SandboxError
        saying so. Cancelling the call (or an exception of progress) closes
        the stream, which cancels the pull on the daemon."""
        op = "pull_image"
        t = self._transport_ready()
        if not isinstance(ref, str):
            raise SandboxError(f"ref must be a str, got {type(ref).__name__}", op=op)
        body: dict[str, str] = {"ref": ref}
        if platform:
            body["platform"] = platform
        data = BytesPayload(to_json(body).encode(), content_type="application/json")
        resp = await t.request(op, "POST", "/v1/images/pull", data=data, headers={"Accept": NDJSON})
        try:
            info = await self._read_pull(t, op, resp, progress)
        except BaseException:
            resp.close()  # an unfinished stream: the daemon sees the client go
            raise
        resp.release()
        return info

    @staticmethod
    async def _read_pull(
        t: Transport,
        op: str,
        resp: aiohttp.ClientResponse,
        progress: PullProgressCallback | None,
    ) -> SandboxImageInfo:
        if resp.content_type != NDJSON:
            raise SandboxError(
                f"the daemon at {t.display} answered the pull with {resp.content_type!r}, not "
                f"the {NDJSON} stream of its progress",
                op=op,
            )
        try:
            async for raw in resp.content:
                if not raw.strip():
                    continue
                try:
                    line = from_json(raw)
                    if not isinstance(line, dict):
                        raise ValueError("not an object")
                    err = line.get("error")
                    if isinstance(err, dict):
                        raise error_from_wire(err)
                    if "image" in line:
                        return SandboxImageInfo.model_validate(line["image"])
                    event = SandboxPullProgress.model_validate(line)
                except (ValueError, ValidationError):
                    raise SandboxError(
                        f"the daemon at {t.display} sent a line of the pull stream that is not "
                        "the expected JSON",
                        op=op,
                    ) from None
                if progress is not None:
                    r = progress(event)
                    if inspect.isawaitable(r):
                        await r
        except aiohttp.ClientError as e:
            raise SandboxError(
                f"the pull stream from the daemon at {t.display} broke off ({e}); whether the "
                "image was pulled is unknown",
                op=op,
            ) from None
        raise SandboxError(
            f"the pull stream from the daemon at {t.display} ended before its outcome; whether "
            "the image was pulled is unknown (list_images says)",
            op=op,
        )

    async def list_images(self) -> list[SandboxImageInfo]:
        """The images the daemon holds, sorted by name; none for a provider
        that keeps no images."""
        t = self._transport_ready()
        body = await t.call("list_images", "GET", "/v1/images")
        return [SandboxImageInfo.model_validate(i) for i in (body or {}).get("images") or []]

    async def remove_image(self, name: str) -> None:
        """Removes the image name (as list_images names it) and the layers
        no other image uses. A name the daemon does not hold is a
        SandboxImageNotFoundError; an image a live session uses is refused
        with a SandboxError saying so; an empty name is refused without a
        request."""
        op = "remove_image"
        t = self._transport_ready()
        if not isinstance(name, str) or not name:
            raise SandboxError("an image name (a non-empty str) is required", op=op)
        # The route takes the rest of the path: each part escaped on its own.
        path = "/".join(quote(p, safe="") for p in name.split("/"))
        await t.call(op, "DELETE", "/v1/images/" + path)

    async def prune_images(self) -> SandboxPruneResult:
        """Removes the layers no image uses and says what went."""
        t = self._transport_ready()
        return SandboxPruneResult.model_validate(
            await t.call("prune_images", "POST", "/v1/images/prune")
        )

    # Exec handles: tracked so that a destroy through this client lifts
    # their bound, and close drops them.

    def _register(self, sid: str, ws: aiohttp.ClientWebSocketResponse[bool]) -> Tai42ExecHandle:
        async def gone() -> bool:
            return await session_gone_checker(self._t, sid, lambda: self.destroy_session(sid))

        h = Tai42ExecHandle(self._t, sid, ws, self._unregister, gone)
        self._handles[h] = None
        return h

    def _unregister(self, h: Tai42ExecHandle) -> None:
        self._handles.pop(h, None)

    def _session_gone(self, sid: str) -> None:
        for h in list(self._handles):
            if h.session_id == sid:
                h.unbound()


__all__ = ["PullProgressCallback", "SandboxExecHandle", "Tai42Sandbox", "Tai42Session"]
