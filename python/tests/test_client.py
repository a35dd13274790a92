"""Tai42Sandbox and Tai42Session against a real daemon: every method, and
every error kind the daemon can be made to give."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from tai42_contract.sandbox import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxOutputLimitError,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxSpecRejectedError,
)
from tai42_sandbox import SandboxTransportError, Tai42Sandbox

from .conftest import Daemon

MiB = 1 << 20


async def test_policy(sandbox: Tai42Sandbox) -> None:
    p = await sandbox.policy()
    assert (p.egress, p.isolation, p.durable) == ("egress", "none", True)


async def test_session_lifecycle(sandbox: Tai42Sandbox) -> None:
    s = await sandbox.create_session(
        SandboxSessionSpec(image="host", ttl_seconds=60, labels={"team": "py"})
    )
    info = await s.info()
    assert (info.id, info.image, info.labels) == (s.id, "host", {"team": "py"})
    assert info.workspace_path == s.workspace_path
    got = await sandbox.get_session(s.id)
    assert (got.id, got.workspace_path) == (s.id, s.workspace_path)
    assert s.id in [i.id for i in await sandbox.list_sessions()]
    await asyncio.sleep(1.1)
    await s.touch()
    assert (await s.info()).expires_at > info.expires_at
    await s.destroy()
    await s.destroy()  # idempotent
    await sandbox.destroy_session(s.id)  # an already gone id is no error
    with pytest.raises(SandboxSessionNotFoundError) as e:
        await s.exec(["true"], timeout_seconds=5)
    assert e.value.session_id == s.id
    assert "destroyed through this client" in str(e.value)
    with pytest.raises(SandboxSessionNotFoundError):
        await sandbox.get_session(s.id)


async def test_session_destroyed_elsewhere(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    await sandbox.destroy_session(s.id)
    for call in (s.info(), s.touch(), s.get_file("a"), s.exec(["true"], timeout_seconds=5)):
        with pytest.raises(SandboxSessionNotFoundError) as e:
            await call
        assert e.value.session_id == s.id


async def test_reap(sandbox: Tai42Sandbox) -> None:
    s = await sandbox.create_session(SandboxSessionSpec(image="host", ttl_seconds=1))
    keep = await sandbox.create_session(SandboxSessionSpec(image="host", ttl_seconds=600))
    await asyncio.sleep(1.3)
    reaped = await sandbox.reap()
    assert s.id in reaped
    assert keep.id not in reaped


async def test_spec_rejected_by_the_daemon(sandbox: Tai42Sandbox) -> None:
    # Valid in shape, so only the daemon can refuse it: no vm here.
    with pytest.raises(SandboxSpecRejectedError) as e:
        await sandbox.create_session(
            SandboxSessionSpec(image="host", ttl_seconds=60, isolation="vm")
        )
    assert e.value.field == "isolation"
    assert e.value.reason in ("unenforceable", "policy")
    with pytest.raises(SandboxSpecRejectedError) as e:
        await sandbox.create_session(SandboxSessionSpec(image="no-such-image", ttl_seconds=60))
    assert e.value.field == "image"


async def test_spec_rejected_in_python(sandbox: Tai42Sandbox) -> None:
    with pytest.raises(SandboxSpecRejectedError) as e:
        await sandbox.create_session({"image": "host", "ttl_seconds": 0})  # type: ignore[arg-type]
    assert (e.value.field, e.value.reason) == ("ttl_seconds", "invalid")


async def test_exec(sandbox: Tai42Sandbox) -> None:
    s = await sandbox.create_session(
        SandboxSessionSpec(image="host", ttl_seconds=60, env={"BASE": "b", "OVER": "spec"})
    )
    r = await s.exec(
        ["sh", "-c", 'echo "$BASE $OVER $EXTRA"; pwd; cat; printf "\\377\\376" >&2'],
        env={"OVER": SecretStr("exec"), "EXTRA": "plain"},
        stdin=b"from stdin\n",
        timeout_seconds=10,
    )
    assert r.exit_code == 0
    assert r.stdout == f"b exec plain\n{s.workspace_path}\nfrom stdin\n"
    assert r.stderr.encode("utf-8", "surrogateescape") == b"\xff\xfe"
    await s.exec(["mkdir", "sub"], timeout_seconds=10)
    r = await s.exec(["pwd"], cwd="sub", timeout_seconds=10)
    assert r.stdout.strip() == os.path.join(s.workspace_path, "sub")
    r = await s.exec(["sh", "-c", "exit 7"], timeout_seconds=10)
    assert r.exit_code == 7


async def test_exec_timeout_has_lengths(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    t0 = time.monotonic()
    with pytest.raises(SandboxExecTimeoutError) as e:
        await s.exec(["sh", "-c", "printf abc; printf de >&2; exec sleep 30"], timeout_seconds=0.5)
    assert time.monotonic() - t0 < 10
    assert (e.value.timeout_seconds, e.value.stdout_len, e.value.stderr_len) == (0.5, 3, 2)
    assert "abc" not in str(e.value)


async def test_exec_bad_input_refused_before_any_request(
    sandbox: Tai42Sandbox, spec: SandboxSessionSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await sandbox.create_session(spec)
    # The daemon refuses these too, so only a count of the requests tells a
    # local refusal from the daemon's: every HTTP request and WebSocket
    # handshake goes through ClientSession._request.
    sent: list[str] = []
    real = aiohttp.ClientSession._request

    async def counting(self: aiohttp.ClientSession, method: str, url: Any, **kw: Any) -> Any:
        sent.append(f"{method} {url}")
        return await real(self, method, url, **kw)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", counting)
    for t in (0, -1, float("nan"), float("inf")):
        with pytest.raises(SandboxError, match="timeout") as e:
            await s.exec(["true"], timeout_seconds=t)
        assert e.value.op == "exec"
    with pytest.raises(SandboxError, match="stdin must be bytes, got str"):
        await s.exec(["cat"], stdin="text", timeout_seconds=5)  # type: ignore[arg-type]
    with pytest.raises(SandboxError, match="argv must be a list"):
        await s.exec("ls -l", timeout_seconds=5)
    with pytest.raises(SandboxError, match="argv is empty"):
        await s.exec([], timeout_seconds=5)
    with pytest.raises(SandboxError, match="timeout"):
        await s.exec_start(["cat"], timeout_seconds=0)
    with pytest.raises(SandboxError, match="data must be bytes"):
        await s.put_file("a", "text")  # type: ignore[arg-type]
    assert sent == [], f"refused locally, yet sent {sent}"


async def test_daemon_refuses_bad_exec(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    with pytest.raises(SandboxError) as e:
        await s.exec(["true"], cwd="no/such/dir", timeout_seconds=5)
    assert type(e.value) is SandboxError
    assert e.value.op == "exec"
    assert "no/such/dir" in str(e.value)


async def test_output_limit(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory("--max-output-bytes", "1000")
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        with pytest.raises(SandboxOutputLimitError) as e:
            await s.exec(["head", "-c", "5000", "/dev/zero"], timeout_seconds=10)
        assert e.value.limit == 1000
        assert e.value.stdout_len > 1000
        await s.destroy()


async def test_large_stdin_goes_over_the_stream(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory("--max-body-bytes", str(MiB))
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        data = os.urandom(3 * MiB)
        r = await s.exec(["sha256sum"], stdin=data, timeout_seconds=30)
        assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        # And a big file the same daemon refuses: its own body cap.
        with pytest.raises(SandboxTransportError) as e:
            await s.put_file("big", data)
        assert e.value.kind == "too_large"
        await s.destroy()


async def test_unauthorized(daemon: Daemon) -> None:
    sb = Tai42Sandbox(daemon.url, "not-the-token")
    with pytest.raises(SandboxTransportError) as e:
        await sb.connect()
    assert e.value.kind == "unauthorized"
    assert "token" in str(e.value)
    await sb.aclose()
    sb = Tai42Sandbox(daemon.url, "")
    with pytest.raises(SandboxTransportError, match="missing bearer token"):
        await sb.connect()


async def test_unreachable(tmp_path: os.PathLike[str]) -> None:
    sock = os.path.join(tmp_path, "nobody.sock")
    sb = Tai42Sandbox(f"unix:{sock}", "t")
    with pytest.raises(SandboxError, match=f"cannot reach the daemon at unix:{sock}") as e:
        await sb.connect()
    assert not isinstance(e.value, SandboxTransportError)
    with pytest.raises(SandboxError, match=r"cannot reach the daemon at http://127\.0\.0\.1:9"):
        async with Tai42Sandbox("http://127.0.0.1:9", "t"):
            pass


def test_bad_urls() -> None:
    with pytest.raises(SandboxError, match="scheme 'ftp'"):
        Tai42Sandbox("ftp://x", "t")
    with pytest.raises(SandboxError, match="names no socket"):
        Tai42Sandbox("unix:", "t")
    assert Tai42Sandbox("127.0.0.1:4242", "t").url == "http://127.0.0.1:4242"
    secret = Tai42Sandbox("http://127.0.0.1:1", "the-token-value")
    assert "the-token-value" not in repr(secret)


async def test_env_defaults(monkeypatch: pytest.MonkeyPatch, daemon: Daemon) -> None:
    monkeypatch.setenv("TAI42_URL", daemon.url)
    monkeypatch.setenv("TAI42_TOKEN", daemon.token)
    async with Tai42Sandbox() as sb:
        assert sb.url == daemon.url
        assert (await sb.policy()).durable


async def test_not_connected() -> None:
    sb = Tai42Sandbox("http://127.0.0.1:1", "t")
    with pytest.raises(SandboxError, match="not connected"):
        await sb.list_sessions()
    with pytest.raises(SandboxError, match="once connected"):
        _ = sb.exec_default_timeout_seconds


async def test_tcp(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(tcp=True)
    assert d.url.startswith("http://127.0.0.1:")
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        assert (await s.exec(["echo", "hi"], timeout_seconds=5)).stdout == "hi\n"
        await s.destroy()


async def test_daemon_killed_mid_exec(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory()
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        task = asyncio.ensure_future(s.exec(["sleep", "30"], timeout_seconds=60))
        await asyncio.sleep(0.5)
        d.kill()
        with pytest.raises(SandboxError, match="whether the exec took effect is unknown"):
            await task
        with pytest.raises(SandboxError, match="cannot reach the daemon"):
            await s.info()


async def test_concurrent_execs(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    t0 = time.monotonic()
    rs = await asyncio.gather(*(s.exec(["echo", str(i)], timeout_seconds=30) for i in range(50)))
    assert [r.stdout for r in rs] == [f"{i}\n" for i in range(50)]
    assert time.monotonic() - t0 < 20


async def test_files(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    await s.put_file("a.txt", b"hello")
    assert await s.get_file("a.txt") == b"hello"
    await s.put_file("empty", b"")
    assert await s.get_file("empty") == b""
    with pytest.raises(SandboxFileNotFoundError) as e:
        await s.get_file("missing/x")
    assert e.value.path == "missing/x"
    await s.exec(["mkdir", "d"], timeout_seconds=5)
    with pytest.raises(SandboxError) as e2:
        await s.get_file("d")
    assert type(e2.value) is SandboxError
    assert "directory" in str(e2.value)
    with pytest.raises(SandboxFileNotFoundError):
        async with s.open_file("nope"):
            pass


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def test_files_streamed_64mib(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    data = os.urandom(64 * MiB)
    await s.put_file_from("big", _chunks(data, MiB))
    h = hashlib.sha256()
    n = 0
    async with s.open_file("big") as f:
        assert f.size == len(data)
        async for chunk in f:
            h.update(chunk)
            n += len(chunk)
    assert (n, h.hexdigest()) == (len(data), hashlib.sha256(data).hexdigest())
    await s.put_file_from("fromfile", io.BytesIO(data[: MiB + 5]))
    assert await s.get_file("fromfile") == data[: MiB + 5]
    await s.put_file("whole", data)
    assert await s.get_file("whole") == data


async def test_put_from_failing_source_keeps_old_content(
    sandbox: Tai42Sandbox, spec: SandboxSessionSpec
) -> None:
    s = await sandbox.create_session(spec)
    await s.put_file("f", b"old content")

    async def failing() -> AsyncIterator[bytes]:
        yield b"new " * 1000
        raise OSError("the disk went away")

    with pytest.raises(SandboxError, match="reading the data to write failed") as e:
        await s.put_file_from("f", failing())
    assert isinstance(e.value.__cause__, OSError)
    assert await s.get_file("f") == b"old content"
    ls = await s.exec(["ls", "-A"], timeout_seconds=5)
    assert ls.stdout.split() == ["f"]  # no temporary file left
    with pytest.raises(SandboxError, match="source must be"):
        await s.put_file_from("f", 42)  # type: ignore[arg-type]


async def test_exec_as_user(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    try:
        r = await s.exec(["id", "-u"], user="nobody", timeout_seconds=10)
    except SandboxTransportError as e:
        if e.kind == "bad_request" and "user" in str(e):
            pytest.skip("this daemon has no exec user yet (branch exec-user)")
        raise
    assert r.stdout.strip() != "0"
    from tai42_contract.sandbox import SandboxUserNotFoundError

    with pytest.raises(SandboxUserNotFoundError) as e2:
        await s.exec(["true"], user="no-such-user-py", timeout_seconds=10)
    assert e2.value.user == "no-such-user-py"
