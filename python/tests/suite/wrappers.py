"""Wrappers at the contract's faces (Sandbox, SandboxSession,
SandboxExecHandle) that delegate every call to a real sandbox: a mutant
subclasses one of them to break exactly one behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic import SecretStr

from tai42_contract.sandbox import (
    ExecResult,
    Sandbox,
    SandboxExecHandle,
    SandboxSession,
    SandboxSessionInfo,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
)
from tai42_contract.sandbox.testing import Config

Item = SandboxStreamChunk | SandboxStreamExit


class MHandle(SandboxExecHandle):
    """A handle delegating to inner; ``items`` is where a mutant changes the
    output."""

    def __init__(self, sess: MSession, inner: SandboxExecHandle, timeout: float) -> None:
        self.sess = sess
        self.inner = inner
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.exited = False  # the exit item went by
        self.ended = False  # the output ended, however
        self.done = asyncio.Event()  # set when it has
        self.output: AsyncIterator[Item] = self._run()

    async def _run(self) -> AsyncIterator[Item]:
        try:
            async for item in self.items(self.inner.output):
                if isinstance(item, SandboxStreamExit):
                    self.exited = True
                yield item
        finally:
            self.ended = True
            self.done.set()

    def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        return src

    async def write_stdin(self, data: bytes) -> None:
        await self.inner.write_stdin(data)

    async def close_stdin(self) -> None:
        await self.inner.close_stdin()

    async def kill(self) -> None:
        await self.inner.kill()


class MSession(SandboxSession):
    """A session delegating to inner; ``spec`` is the spec it was made with
    (None for one fetched by id the wrapper never made)."""

    handle_cls: type[MHandle] = MHandle

    def __init__(
        self, sb: MSandbox, inner: SandboxSession, spec: SandboxSessionSpec | None
    ) -> None:
        self.sb = sb
        self.inner = inner
        self.spec = spec
        self.id = inner.id
        self.workspace_path = inner.workspace_path

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.inner!r}>"

    async def info(self) -> SandboxSessionInfo:
        return await self.inner.info()

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | None = None,
        stdin: bytes | None = None,
        timeout_seconds: float,
        **kw: Any,
    ) -> ExecResult:
        return await self.inner.exec(
            argv, cwd=cwd, env=env, stdin=stdin, timeout_seconds=timeout_seconds, **kw
        )

    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, SecretStr] | None = None,
        timeout_seconds: float,
        **kw: Any,
    ) -> SandboxExecHandle:
        h = await self.inner.exec_start(
            argv, cwd=cwd, env=env, timeout_seconds=timeout_seconds, **kw
        )
        return self.handle_cls(self, h, timeout_seconds)

    async def put_file(self, path: str, data: bytes) -> None:
        await self.inner.put_file(path, data)

    async def get_file(self, path: str) -> bytes:
        return await self.inner.get_file(path)

    async def touch(self) -> None:
        await self.inner.touch()

    async def destroy(self) -> None:
        await self.inner.destroy()


class MSandbox(Sandbox):
    """A sandbox delegating to inner, its sessions of session_cls."""

    session_cls: type[MSession] = MSession

    def __init__(self, inner: Sandbox, cfg: Config) -> None:
        self.inner = inner
        self.cfg = cfg
        self.exec_default_timeout_seconds = inner.exec_default_timeout_seconds
        self.reap_interval_seconds = inner.reap_interval_seconds
        self.specs: dict[str, SandboxSessionSpec] = {}
        self.made: dict[str, MSession] = {}
        self.tasks: list[asyncio.Future[Any]] = []

    async def aclose(self) -> None:
        """End the tasks a mutant left running."""
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.inner!r}>"

    def wrap(self, inner: SandboxSession) -> MSession:
        s = self.session_cls(self, inner, self.specs.get(inner.id))
        self.made.setdefault(inner.id, s)
        return s

    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        inner = await self.inner.create_session(spec)
        self.specs[inner.id] = spec
        return self.wrap(inner)

    async def get_session(self, session_id: str) -> SandboxSession:
        return self.wrap(await self.inner.get_session(session_id))

    async def list_sessions(self) -> list[SandboxSessionInfo]:
        return await self.inner.list_sessions()

    async def destroy_session(self, session_id: str) -> None:
        await self.inner.destroy_session(session_id)

    async def reap(self) -> list[str]:
        return await self.inner.reap()


Wrap = Callable[[Sandbox, Config], Sandbox]


def wrap(
    sandbox: type[MSandbox] = MSandbox,
    session: type[MSession] | None = None,
    handle: type[MHandle] | None = None,
) -> Wrap:
    """The wrap of a mutant: the sandbox class, its sessions' class and
    their handles' class, each the delegating one unless given."""
    sess_cls = session or sandbox.session_cls
    if handle is not None:
        sess_cls = type(sess_cls.__name__, (sess_cls,), {"handle_cls": handle})
    cls: type[MSandbox] = type(sandbox.__name__, (sandbox,), {"session_cls": sess_cls})

    def make(inner: Sandbox, cfg: Config) -> Sandbox:
        return cls(inner, cfg)

    return make
