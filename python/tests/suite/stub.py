"""A sandbox whose every call fails, for tests of the suite's machinery that
need a Sandbox but no daemon."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tai42_contract.sandbox import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxExecHandle,
    SandboxSession,
    SandboxSessionInfo,
    SandboxSessionSpec,
)


class Stub(Sandbox):
    """A sandbox whose every call fails: the machinery's tests need none."""

    exec_default_timeout_seconds = 0.0
    reap_interval_seconds = 0.0

    def __init__(self) -> None:
        self.destroyed: list[str] = []

    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        return StubSession(self)

    async def get_session(self, session_id: str) -> SandboxSession:
        raise SandboxError("stub")

    async def list_sessions(self) -> list[SandboxSessionInfo]:
        return []

    async def destroy_session(self, session_id: str) -> None:
        self.destroyed.append(session_id)
        if session_id == "sb-undestroyable":
            raise SandboxError("cannot destroy")

    async def reap(self) -> list[str]:
        return []


class StubSession(SandboxSession):
    def __init__(self, sb: Stub, sid: str = "sb-stub") -> None:
        self.id = sid
        self.workspace_path = "/stub"

    async def info(self) -> SandboxSessionInfo:
        raise SandboxError("stub")

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Any = None,
        stdin: bytes | None = None,
        timeout_seconds: float,
    ) -> ExecResult:
        raise SandboxError("stub")

    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Any = None,
        timeout_seconds: float,
    ) -> SandboxExecHandle:
        raise SandboxError("stub")

    async def put_file(self, path: str, data: bytes) -> None:
        raise SandboxError("stub")

    async def get_file(self, path: str) -> bytes:
        raise SandboxError("stub")

    async def touch(self) -> None:
        raise SandboxError("stub")

    async def destroy(self) -> None:
        pass
