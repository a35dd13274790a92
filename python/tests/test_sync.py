"""Tai42SandboxSync: the same client, blocking, on its own loop thread."""

from __future__ import annotations

import threading

import pytest

from tai42_contract.sandbox import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
)
from tai42_sandbox import SandboxTransportError, Tai42SandboxSync

from .conftest import Daemon


def test_sync_flow(daemon: Daemon, spec: SandboxSessionSpec) -> None:
    with Tai42SandboxSync(daemon.url, daemon.token) as sb:
        assert sb.exec_default_timeout_seconds > 0
        assert sb.policy().durable
        s = sb.create_session(spec)
        assert s.exec(["echo", "hi"], timeout_seconds=5).stdout == "hi\n"
        s.put_file("a", b"data")
        assert s.get_file("a") == b"data"
        s.put_file_from("b", iter([b"x" * 10, b"y"]))
        with s.open_file("b") as f:
            assert b"".join(f) == b"x" * 10 + b"y"
        with pytest.raises(SandboxFileNotFoundError):
            s.get_file("missing")
        h = s.exec_start(["cat"], timeout_seconds=10)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend(h.output))
        reader.start()
        for i in range(20):
            h.write_stdin(f"{i}\n".encode())
        h.close_stdin()
        reader.join(10)
        assert not reader.is_alive()
        data = b"".join(i.data for i in got if isinstance(i, SandboxStreamChunk))
        assert data == b"".join(f"{i}\n".encode() for i in range(20))
        assert isinstance(got[-1], SandboxStreamExit)
        h.kill()
        assert s.id in [i.id for i in sb.list_sessions()]
        s.touch()
        s.destroy()
        assert s.id not in [i.id for i in sb.list_sessions()]
    with pytest.raises(SandboxError, match="closed"):
        sb.list_sessions()
    sb.close()  # again: no-op


def test_sync_errors(daemon: Daemon) -> None:
    with pytest.raises(SandboxTransportError) as e:
        Tai42SandboxSync(daemon.url, "wrong").__enter__()
    assert e.value.kind == "unauthorized"
    before = threading.active_count()
    sb = Tai42SandboxSync(daemon.url, daemon.token)
    sb.connect()
    sb.close()
    assert threading.active_count() <= before
