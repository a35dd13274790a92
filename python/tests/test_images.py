"""Images through the client: the pull's NDJSON stream read event by event
(against a scripted server on loopback), its errors, its cancellation, the
names in the removal's path; and a real daemon of the host runner, whose
provider keeps no images."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import unquote

import pytest

from tai42_contract.sandbox import (
    SandboxError,
    SandboxImageInfo,
    SandboxImageNotFoundError,
    SandboxImagePullError,
    SandboxPruneResult,
    SandboxPullProgress,
)
from tai42_sandbox import Tai42Sandbox, Tai42SandboxSync

from .conftest import Daemon

_SANDBOX = (
    b'{"provider":"container","exec_default_timeout_seconds":1,"reap_interval_seconds":1,'
    b'"policy":{"egress":"none","isolation":"none","scrub_transcript":false,"durable":false},'
    b'"max_body_bytes":1,"version":"x"}'
)

Request = tuple[str, str, dict[str, str], bytes]
Answer = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

EVENTS = [
    {"ref": "ghcr.io/o/r:tag", "status": "resolved", "digest": "sha256:d1"},
    {"ref": "ghcr.io/o/r:tag", "status": "exists", "layer": "sha256:l0"},
    {"ref": "ghcr.io/o/r:tag", "status": "fetching", "layer": "sha256:l1", "done": 5, "total": 9},
    {"ref": "ghcr.io/o/r:tag", "status": "done", "layer": "sha256:l1"},
    {"ref": "ghcr.io/o/r:tag", "status": "complete", "digest": "sha256:d1"},
]
IMAGE = {
    "name": "ghcr.io/o/r:tag",
    "id": "sha256:c0",
    "digest": "sha256:d1",
    "platform": "linux/arm64",
    "size": 3145728,
    "shared_size": 1048576,
    "layers": 2,
    "pulled": "2026-01-02T03:04:05Z",
}


def _response(status: str, ctype: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _ndjson(*lines: object) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def _stream_head() -> bytes:
    # No length: the body runs to the close, as a chunked one would to its end.
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"


@contextlib.asynccontextmanager
async def scripted(answer: Answer) -> AsyncIterator[tuple[Tai42Sandbox, list[Request]]]:
    """A client of a loopback HTTP server that answers GET /v1/sandbox
    itself and every other request (recorded) with answer, one connection
    per request."""
    seen: list[Request] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = (await r.readuntil(b"\r\n\r\n")).decode()
            first, *rest = head.split("\r\n")
            method, path, _ = first.split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest if h)
            }
            body = await r.readexactly(int(headers.get("content-length", "0")))
            if path == "/v1/sandbox":
                w.write(_response("200 OK", "application/json", _SANDBOX))
            else:
                seen.append((method, path, headers, body))
                await answer((method, path, headers, body), r, w)
            await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with Tai42Sandbox(f"http://127.0.0.1:{port}", "tok") as sb:
            yield sb, seen
    finally:
        srv.close()
        await srv.wait_closed()


async def test_pull_stream() -> None:
    async def answer(req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(_stream_head() + _ndjson(*EVENTS, {"image": IMAGE}))

    got: list[SandboxPullProgress] = []
    async with scripted(answer) as (sb, seen):
        info = await sb.pull_image("ghcr.io/o/r:tag", platform="linux/arm64", progress=got.append)

        async def slow(ev: SandboxPullProgress) -> None:  # a coroutine function is awaited
            await asyncio.sleep(0)
            got.append(ev)

        again = await sb.pull_image("ghcr.io/o/r:tag", progress=slow)
        assert await sb.pull_image("ghcr.io/o/r:tag") == info  # no progress: fine
    assert info == again == SandboxImageInfo.model_validate(IMAGE)
    assert info.shared_size == 1048576
    assert info.pulled.year == 2026
    assert got == [SandboxPullProgress.model_validate(e) for e in EVENTS * 2]
    assert (got[2].done, got[2].total, got[0].layer) == (5, 9, "")
    method, path, headers, body = seen[0]
    assert (method, path) == ("POST", "/v1/images/pull")
    assert json.loads(body) == {"ref": "ghcr.io/o/r:tag", "platform": "linux/arm64"}
    assert headers["accept"] == "application/x-ndjson"
    assert headers["authorization"] == "Bearer tok"
    assert json.loads(seen[1][3]) == {"ref": "ghcr.io/o/r:tag"}


async def test_pull_errors() -> None:
    mid = {
        "kind": "image_pull",
        "message": 'sandbox: pulling image "r:1" (unauthorized): the registry refused the '
        "credentials",
        "op": "pull_image",
        "ref": "r:1",
        "reason": "unauthorized",
    }
    early = {
        "kind": "image_pull",
        "message": 'sandbox: pulling image "Bad Ref" (invalid_reference): could not parse',
        "op": "pull_image",
        "ref": "Bad Ref",
        "reason": "invalid_reference",
    }
    answers = {
        "mid": _stream_head() + _ndjson(EVENTS[0], {"error": mid}),
        "early": _response("400 Bad Request", "application/json", _ndjson({"error": early})),
        "cut": _stream_head() + _ndjson(EVENTS[0]),
        "garbled": _stream_head() + b'{"ref":\n',
        "json": _response("200 OK", "application/json", _ndjson({"image": IMAGE})),
    }

    async def answer(req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(answers[json.loads(req[3])["ref"]])

    async with scripted(answer) as (sb, _):
        got: list[SandboxPullProgress] = []
        with pytest.raises(SandboxImagePullError) as e:
            await sb.pull_image("mid", progress=got.append)
        assert (e.value.ref, e.value.reason, e.value.op) == ("r:1", "unauthorized", "pull_image")
        assert e.value.detail == "the registry refused the credentials"
        assert str(e.value) == mid["message"]
        assert len(got) == 1
        with pytest.raises(SandboxImagePullError) as e:
            await sb.pull_image("early")
        assert (e.value.ref, e.value.reason) == ("Bad Ref", "invalid_reference")
        for ref, says in (
            ("cut", "ended before its outcome"),
            ("garbled", "not the expected JSON"),
            ("json", "not the application/x-ndjson stream"),
        ):
            with pytest.raises(SandboxError, match=says) as e2:
                await sb.pull_image(ref)
            assert not isinstance(e2.value, SandboxImagePullError)
            assert e2.value.op == "pull_image"
        with pytest.raises(SandboxError, match="ref must be a str"):
            await sb.pull_image(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["cancel", "raise"])
async def test_pull_ends_when_the_caller_does(how: str) -> None:
    """A cancelled call, or a progress that raises, closes the stream: the
    daemon sees its client go (and cancels the pull)."""
    gone = asyncio.Event()

    async def answer(req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(_stream_head() + _ndjson(EVENTS[0]))
        await w.drain()
        await asyncio.wait_for(r.read(), 10)  # b"" once the client closed
        gone.set()

    first = asyncio.Event()

    def progress(ev: SandboxPullProgress) -> None:
        first.set()
        if how == "raise":
            raise RuntimeError("the caller's own failure")

    async with scripted(answer) as (sb, _):
        task = asyncio.get_running_loop().create_task(sb.pull_image("r:1", progress=progress))
        await asyncio.wait_for(first.wait(), 10)
        if how == "cancel":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(RuntimeError, match="the caller's own failure"):
                await task
        await asyncio.wait_for(gone.wait(), 10)


async def test_list_remove_prune() -> None:
    async def answer(req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        method, path, _, _ = req
        if method == "GET":
            w.write(_response("200 OK", "application/json", _ndjson({"images": [IMAGE]})))
        elif method == "POST":
            w.write(_response("200 OK", "application/json", b'{"layers":2,"bytes":4096}'))
        elif unquote(path).endswith("gone:1"):
            e = {
                "kind": "image_not_found",
                "message": 'sandbox: no image "gone:1" in the store',
                "op": "remove_image",
                "image": "gone:1",
            }
            w.write(_response("404 Not Found", "application/json", _ndjson({"error": e})))
        else:
            w.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    names = ["ghcr.io/o/r:tag", "127.0.0.1:5000/r@sha256:9f1c", "odd name%/x?y#z"]
    async with scripted(answer) as (sb, seen):
        assert await sb.list_images() == [SandboxImageInfo.model_validate(IMAGE)]
        assert await sb.prune_images() == SandboxPruneResult(layers=2, bytes=4096)
        for n in names:
            await sb.remove_image(n)
        with pytest.raises(SandboxImageNotFoundError) as e:
            await sb.remove_image("gone:1")
        assert e.value.image == "gone:1"
        before = len(seen)
        with pytest.raises(SandboxError, match="image name"):
            await sb.remove_image("")
        assert len(seen) == before
    removed = [p for m, p, _, _ in seen if m == "DELETE"][: len(names)]
    prefix = "/v1/images/"
    assert all(p.startswith(prefix) for p in removed)
    # Each part of the name escaped on its own, the '/' between them kept.
    assert ["/".join(unquote(s) for s in p[len(prefix) :].split("/")) for p in removed] == names
    assert "?" not in removed[2]
    assert "#" not in removed[2]


@pytest.fixture(scope="module")
def host_daemon(tai42_bin: str) -> Iterator[Daemon]:
    d = Daemon(tai42_bin, "host").start()
    yield d
    d.stop()


async def test_host_daemon_keeps_no_images(host_daemon: Daemon) -> None:
    async with Tai42Sandbox(host_daemon.url, host_daemon.token) as sb:
        assert await sb.list_images() == []

        def no_progress(ev: SandboxPullProgress) -> None:
            pytest.fail(f"progress from a provider without images: {ev}")

        calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("pull_image", lambda: sb.pull_image("python:3.12-slim", progress=no_progress)),
            ("remove_image", lambda: sb.remove_image("python:3.12-slim")),
            ("prune_images", sb.prune_images),
        ]
        for op, call in calls:
            with pytest.raises(SandboxError, match="provider host keeps no images") as e:
                await call()
            assert e.value.op == op
            assert not isinstance(e.value, (SandboxImagePullError, SandboxImageNotFoundError))


def test_host_daemon_sync(host_daemon: Daemon) -> None:
    with Tai42SandboxSync(host_daemon.url, host_daemon.token) as sb:
        assert sb.list_images() == []
        with pytest.raises(SandboxError, match="keeps no images"):
            sb.pull_image("python:3.12-slim")
        with pytest.raises(SandboxError, match="keeps no images"):
            sb.remove_image("python:3.12-slim")
        with pytest.raises(SandboxError, match="keeps no images"):
            sb.prune_images()
