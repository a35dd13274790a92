"""The provider face: the Sandbox / SandboxSession / SandboxExecHandle ABCs.

The app core depends only on these and stays sandbox-agnostic; a provider
implements them and registers with :func:`register_sandbox`. Signatures are
the contract text's exactly: keyword-only options, ``timeout_seconds``
required, ``output`` an async iterator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence

from pydantic import SecretStr

from .models import (
    ExecResult,
    SandboxSessionInfo,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
)


class SandboxExecHandle(ABC):
    """A live interactive exec started by :meth:`SandboxSession.exec_start`.

    CONCURRENCY: write_stdin / close_stdin are safe to call concurrently with
    active output iteration. A single write_stdin call delivers its bytes
    intact and in order; the provider does no framing (a consumer
    multiplexing a line protocol holds its own single-writer lock).

    LIFETIME: kill may be called at any time and more than once. Once the
    exec has exited it is idempotent and never raises, and the exit status
    output reports stays the exec's own; write_stdin then raises a typed
    SandboxError. A handle may keep provider resources until kill has
    returned or its session is destroyed: a consumer done with a handle
    calls kill.
    """

    output: AsyncIterator[SandboxStreamChunk | SandboxStreamExit]
    """The interleaved stdout/stderr stream, terminated by one
    SandboxStreamExit. On timeout_seconds expiry the provider kills the exec
    and the iterator raises SandboxExecTimeoutError. A failure of the exec
    itself ends the stream with a SandboxError instead of the exit item.
    Once kill has returned, the stream ends after the output the provider
    received before the kill, which it still yields, in order."""

    @abstractmethod
    async def write_stdin(self, data: bytes) -> None:
        """Deliver data to the exec's stdin intact and in order."""

    @abstractmethod
    async def close_stdin(self) -> None:
        """Signal end-of-input to the exec."""

    @abstractmethod
    async def kill(self) -> None:
        """Terminate the exec. Idempotent, never raising once the exec has
        exited, and callable at any time. Once this returns, output ends
        promptly and raises no timeout, even past the deadline: the output
        received before the kill is still yielded, in order, then exactly one
        SandboxStreamExit with the exec's own exit status, or a SandboxError
        when the provider cannot read that status (it never invents one)."""


class SandboxSession(ABC):
    """One live sandbox session: the unit a consumer runs code in."""

    id: str
    """This session's provider-assigned id."""

    workspace_path: str
    """The provider's ABSOLUTE root path for this session's workspace, the
    anchor of workspace-relative cwd and paths."""

    @abstractmethod
    async def info(self) -> SandboxSessionInfo:
        """This session's observable state."""

    @abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | None = None,
        stdin: bytes | None = None,
        timeout_seconds: float,
    ) -> ExecResult:
        """Run argv to completion and return its ExecResult. On expiry of the
        REQUIRED timeout_seconds the provider kills the exec and raises
        SandboxExecTimeoutError. env overlays the session's spec.env
        (per-exec keys win); cwd is workspace-relative by default (unset is
        workspace_path)."""

    @abstractmethod
    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | None = None,
        timeout_seconds: float,
    ) -> SandboxExecHandle:
        """Start argv as an INTERACTIVE exec. On expiry of the REQUIRED
        timeout_seconds the provider kills the exec and the handle's output
        iterator raises SandboxExecTimeoutError. env and cwd as for exec."""

    @abstractmethod
    async def put_file(self, path: str, data: bytes) -> None:
        """Write data to path (workspace-relative by default)."""

    @abstractmethod
    async def get_file(self, path: str) -> bytes:
        """Read path (workspace-relative by default). Raise
        SandboxFileNotFoundError when path does not exist; any other read
        failure raises the base SandboxError with the real message."""

    @abstractmethod
    async def touch(self) -> None:
        """Extend expires_at by the session's ttl: a keep-alive turn."""

    @abstractmethod
    async def destroy(self) -> None:
        """Tear this session down."""


class Sandbox(ABC):
    """Abstract sandbox provider: it creates and destroys disposable
    SandboxSession instances and reaps expired ones."""

    exec_default_timeout_seconds: float
    """The provider's configured default for one short exec; exec itself
    still requires timeout_seconds."""

    reap_interval_seconds: float
    """The provider's configured reap sweep cadence."""

    @abstractmethod
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        """Create a session from spec or REJECT it with
        SandboxSpecRejectedError."""

    @abstractmethod
    async def get_session(self, session_id: str) -> SandboxSession:
        """Fetch a live session by id. Raise SandboxSessionNotFoundError if
        absent."""

    @abstractmethod
    async def list_sessions(self) -> list[SandboxSessionInfo]:
        """The observable state of every live session."""

    @abstractmethod
    async def destroy_session(self, session_id: str) -> None:
        """Tear a session down. Idempotent on an already-gone session."""

    @abstractmethod
    async def reap(self) -> list[str]:
        """Destroy every session past its expires_at and return the destroyed
        ids."""


__all__ = ["Sandbox", "SandboxExecHandle", "SandboxSession"]
