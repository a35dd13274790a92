"""The interactive exec over the WebSocket against a real daemon: the whole
handle contract (concurrent stdin and output, intact writes, close_stdin,
kill at any time, timeouts) and a daemon that dies mid-stream."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable

import pytest

from tai42_contract.sandbox import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
)
from tai42_sandbox import SandboxTransportError, Tai42ExecHandle, Tai42Sandbox, Tai42Session

from .conftest import Daemon

MiB = 1 << 20


async def _drain(h: Tai42ExecHandle) -> tuple[bytes, bytes, int]:
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    code = None
    async for item in h.output:
        if isinstance(item, SandboxStreamChunk):
            out[item.stream].append(item.data)
        else:
            assert isinstance(item, SandboxStreamExit)
            assert code is None, "two exit items"
            code = item.exit_code
    assert code is not None
    return b"".join(out["stdout"]), b"".join(out["stderr"]), code


@pytest.fixture
async def session(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> Tai42Session:
    return await sandbox.create_session(spec)


async def test_cat(session: Tai42Session) -> None:
    h = await session.exec_start(["sh", "-c", "cat; echo done >&2; exit 4"], timeout_seconds=10)
    await h.write_stdin(b"hello ")
    await h.write_stdin(b"world")
    await h.close_stdin()
    await h.close_stdin()  # idempotent
    assert await _drain(h) == (b"hello world", b"done\n", 4)
    with pytest.raises(StopAsyncIteration):
        await h.output.__anext__()
    with pytest.raises(SandboxError, match="ended"):
        await h.write_stdin(b"late")
    await h.kill()
    await h.kill()


async def test_large_write_is_intact(session: Tai42Session) -> None:
    data = os.urandom(5 * MiB + 123)  # more than one frame
    h = await session.exec_start(["sha256sum"], timeout_seconds=30)
    await h.write_stdin(data)
    await h.close_stdin()
    out, _, code = await _drain(h)
    assert code == 0
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    await h.kill()


async def test_write_while_iterating(session: Tai42Session) -> None:
    """write_stdin from one task while another iterates output: no
    deadlock, and every write arrives whole and in order."""
    h = await session.exec_start(["cat"], timeout_seconds=30)
    lines = [f"line {i} ".encode() * 50 + b"\n" for i in range(300)]
    got: list[bytes] = []

    async def read() -> None:
        async for item in h.output:
            if isinstance(item, SandboxStreamChunk):
                got.append(item.data)

    reader = asyncio.ensure_future(read())
    lock = asyncio.Lock()

    async def write(part: list[bytes]) -> None:
        for line in part:
            async with lock:
                await h.write_stdin(line)

    # Two writers with one lock, as the contract says a consumer does.
    await asyncio.gather(write(lines[::2]), write(lines[1::2]))
    await h.close_stdin()
    await asyncio.wait_for(reader, 30)
    received = b"".join(got).splitlines(keepends=True)
    assert sorted(received) == sorted(lines)  # each write whole
    assert [x for x in received if x in set(lines[::2])] == lines[::2]  # in order
    await h.kill()


async def test_kill_running(session: Tai42Session) -> None:
    h = await session.exec_start(["sh", "-c", "echo ready; exec sleep 60"], timeout_seconds=60)
    first = await h.output.__anext__()
    assert isinstance(first, SandboxStreamChunk)
    assert first.data == b"ready\n"
    t0 = time.monotonic()
    await asyncio.gather(h.kill(), h.kill())  # concurrent kills share one request
    items = [i async for i in h.output]
    assert time.monotonic() - t0 < 10
    assert len(items) == 1
    assert isinstance(items[0], SandboxStreamExit)
    await h.kill()  # idempotent after the end
    with pytest.raises(SandboxError, match="killed"):
        await h.write_stdin(b"x")


async def test_output_before_kill_is_yielded(session: Tai42Session) -> None:
    h = await session.exec_start(
        ["sh", "-c", "head -c 100000 /dev/zero; echo; exec sleep 60"], timeout_seconds=60
    )
    # Wait until the output has reached the handle, unread, then kill.
    while h._queued < 100001:  # noqa: ASYNC110 (polls the handle's private state)
        await asyncio.sleep(0.01)
    await h.kill()
    out, _, _ = await _drain(h)
    assert out == b"\0" * 100000 + b"\n"


async def test_kill_at_once(session: Tai42Session) -> None:
    h = await session.exec_start(["sleep", "60"], timeout_seconds=60)
    await h.kill()
    items = [i async for i in h.output]
    assert len(items) == 1
    assert isinstance(items[0], SandboxStreamExit)


async def test_timeout_raises_with_lengths(session: Tai42Session) -> None:
    h = await session.exec_start(
        ["sh", "-c", "printf abcd; printf e >&2; exec sleep 60"], timeout_seconds=0.5
    )
    got: list[bytes] = []

    async def read() -> None:
        async for item in h.output:
            if isinstance(item, SandboxStreamChunk) and item.stream == "stdout":
                got.append(item.data)

    with pytest.raises(SandboxExecTimeoutError) as e:
        await read()
    assert (e.value.stdout_len, e.value.stderr_len, e.value.timeout_seconds) == (4, 1, 0.5)
    assert b"".join(got) == b"abcd"
    with pytest.raises(SandboxExecTimeoutError):  # again, the same end
        await h.output.__anext__()
    await h.kill()  # never raises once the exec has ended


async def test_kill_after_deadline_reports_no_timeout(session: Tai42Session) -> None:
    h = await session.exec_start(["sleep", "60"], timeout_seconds=0.3)
    await asyncio.sleep(1.0)  # the daemon has timed it out; nobody read it
    await h.kill()
    items = [i async for i in h.output]
    assert len(items) == 1
    assert isinstance(items[0], SandboxStreamExit)


async def test_start_errors(sandbox: Tai42Sandbox, session: Tai42Session) -> None:
    with pytest.raises(SandboxError) as e:
        await session.exec_start(["true"], cwd="no/such/dir", timeout_seconds=5)
    assert "no/such/dir" in str(e.value)
    gone = await sandbox.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
    await sandbox.destroy_session(gone.id)
    with pytest.raises(SandboxSessionNotFoundError) as e2:
        await gone.exec_start(["true"], timeout_seconds=5)
    assert e2.value.session_id == gone.id


async def test_destroy_ends_a_handle_nobody_reads(
    sandbox: Tai42Sandbox, session: Tai42Session
) -> None:
    # Output far past the bound, nobody reading: a destroy frees the handle.
    h = await session.exec_start(["sh", "-c", "exec cat /dev/zero"], timeout_seconds=60)
    await asyncio.sleep(0.5)
    await session.destroy()
    await asyncio.wait_for(h._reader, 30)
    with pytest.raises(SandboxError):
        async for _ in h.output:
            pass


async def test_close_drops_open_streams(daemon: Daemon, spec: SandboxSessionSpec) -> None:
    async with Tai42Sandbox(daemon.url, daemon.token) as sb:
        s = await sb.create_session(spec)
        h = await s.exec_start(["sleep", "60"], timeout_seconds=60)
    with pytest.raises(SandboxError, match="outcome is unknown"):
        await h.output.__anext__()
    async with Tai42Sandbox(daemon.url, daemon.token) as sb:
        await sb.destroy_session(s.id)


async def test_daemon_killed_mid_stream(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory()
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        h = await s.exec_start(["sh", "-c", "echo before; exec sleep 60"], timeout_seconds=60)
        first = await h.output.__anext__()
        assert isinstance(first, SandboxStreamChunk)
        d.kill()
        with pytest.raises(SandboxError, match="outcome is unknown") as e:
            async for _ in h.output:
                pass
        assert e.value.op == "exec_start"
        with pytest.raises(SandboxError, match="ended"):
            await h.write_stdin(b"x")
        await h.kill()  # the stream has ended: no error


async def test_many_streams_at_once(session: Tai42Session) -> None:
    async def one(i: int) -> bytes:
        h = await session.exec_start(["cat"], timeout_seconds=30)
        await h.write_stdin(str(i).encode())
        await h.close_stdin()
        out, _, _ = await _drain(h)
        await h.kill()
        return out

    outs = await asyncio.gather(*(one(i) for i in range(20)))
    assert outs == [str(i).encode() for i in range(20)]


async def test_daemon_shutting_down(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory("--shutdown-grace", "1s")
    async with Tai42Sandbox(d.url, d.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=60))
        h = await s.exec_start(["sleep", "60"], timeout_seconds=60)
        assert d.proc is not None
        d.proc.terminate()  # SIGTERM: a graceful stop
        with pytest.raises(SandboxTransportError) as e:
            await asyncio.wait_for(h.output.__anext__(), 30)
        assert e.value.kind == "shutting_down"
        await h.kill()
