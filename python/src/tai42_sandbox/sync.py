"""The synchronous facade, for scripts and notebooks: the async client run
on one private event loop in a background thread. Same methods, same
errors; a call blocks until its coroutine has finished on that loop (an
interrupt, such as Ctrl-C, cancels it)."""

from __future__ import annotations

import asyncio
import ssl as _ssl
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from pydantic import SecretStr

from tai42_contract.sandbox import (
    ExecResult,
    SandboxError,
    SandboxImageInfo,
    SandboxPolicy,
    SandboxPruneResult,
    SandboxSessionInfo,
    SandboxSessionSpec,
    SandboxStreamChunk,
    SandboxStreamExit,
    SandboxWorkspaceInfo,
)

from ._exec import Tai42ExecHandle
from ._files import BinaryReader, Tai42FileReader
from .client import PullProgressCallback, Tai42Sandbox, Tai42Session, _OpenFile

T = TypeVar("T")


class _Loop:
    """One event loop running in a daemon thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tai42-sandbox-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            coro.close()
            raise SandboxError("the client is closed", op="client")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Tai42ExecHandleSync:
    """The blocking face of a Tai42ExecHandle: write_stdin and close_stdin
    are safe from one thread while another iterates ``output``."""

    def __init__(self, loop: _Loop, h: Tai42ExecHandle) -> None:
        self._loop = loop
        self._h = h

    def write_stdin(self, data: bytes) -> None:
        self._loop.run(self._h.write_stdin(data))

    def close_stdin(self) -> None:
        self._loop.run(self._h.close_stdin())

    def kill(self) -> None:
        self._loop.run(self._h.kill())

    @property
    def output(self) -> Iterator[SandboxStreamChunk | SandboxStreamExit]:
        """The stream's items, as the async handle's output yields them."""
        return _SyncIter(self._loop, self._h.output)


class _SyncIter(Iterator[T]):
    def __init__(self, loop: _Loop, it: AsyncIterator[T]) -> None:
        self._loop = loop
        self._it = it

    def __iter__(self) -> _SyncIter[T]:
        return self

    def __next__(self) -> T:
        try:
            return self._loop.run(_anext(self._it))
        except StopAsyncIteration:
            raise StopIteration from None


async def _anext(it: AsyncIterator[T]) -> T:
    return await it.__anext__()


class Tai42FileReaderSync(Iterator[bytes]):
    """A streamed download: an iterator of bytes chunks, and read()."""

    def __init__(self, loop: _Loop, opener: _OpenFile) -> None:
        self._loop = loop
        self._opener = opener
        self._r: Tai42FileReader | None = None

    def __enter__(self) -> Tai42FileReaderSync:
        self._r = self._loop.run(self._opener.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._loop.run(self._opener.__aexit__(et, e, tb))

    def _reader(self) -> Tai42FileReader:
        if self._r is None:
            raise SandboxError("use the reader as `with s.open_file(path) as f`", op="get_file")
        return self._r

    @property
    def size(self) -> int | None:
        return self._reader().size

    def __iter__(self) -> Tai42FileReaderSync:
        return self

    def __next__(self) -> bytes:
        try:
            return self._loop.run(_anext(self._reader()))
        except StopAsyncIteration:
            raise StopIteration from None

    def read(self, n: int = -1) -> bytes:
        return self._loop.run(self._reader().read(n))


async def _aiter_of(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


class Tai42SessionSync:
    """The blocking face of a Tai42Session."""

    def __init__(self, loop: _Loop, s: Tai42Session) -> None:
        self._loop = loop
        self._s = s
        self.id = s.id
        self.workspace_path = s.workspace_path

    def __repr__(self) -> str:
        return repr(self._s).replace("Tai42Session", "Tai42SessionSync")

    def info(self) -> SandboxSessionInfo:
        return self._loop.run(self._s.info())

    def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, SecretStr | str] | None = None,
        stdin: bytes | None = None,
        timeout_seconds: float,
        user: str | None = None,
    ) -> ExecResult:
        return self._loop.run(
            self._s.exec(
                argv, cwd=cwd, env=env, stdin=stdin, timeout_seconds=timeout_seconds, user=user
            )
        )

    def exec_start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, SecretStr | str] | None = None,
        timeout_seconds: float,
        user: str | None = None,
    ) -> Tai42ExecHandleSync:
        h = self._loop.run(
            self._s.exec_start(argv, cwd=cwd, env=env, timeout_seconds=timeout_seconds, user=user)
        )
        return Tai42ExecHandleSync(self._loop, h)

    def put_file(self, path: str, data: bytes) -> None:
        self._loop.run(self._s.put_file(path, data))

    def put_file_from(self, path: str, source: BinaryReader | Iterable[bytes]) -> None:
        """Streams a binary file object, or an iterable of bytes chunks."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            return self.put_file(path, bytes(source))
        src: Any = source if hasattr(source, "read") else _aiter_of(source)
        self._loop.run(self._s.put_file_from(path, src))

    def get_file(self, path: str) -> bytes:
        return self._loop.run(self._s.get_file(path))

    def open_file(self, path: str) -> Tai42FileReaderSync:
        return Tai42FileReaderSync(self._loop, self._s.open_file(path))

    def touch(self) -> None:
        self._loop.run(self._s.touch())

    def destroy(self) -> None:
        self._loop.run(self._s.destroy())


class Tai42SandboxSync:
    """Tai42Sandbox for code without an event loop::

        with Tai42SandboxSync() as sb:
            s = sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=600))
            print(s.exec(["uname", "-a"], timeout_seconds=10).stdout)
            s.destroy()

    The arguments are Tai42Sandbox's. ``close`` (or leaving the with
    block) closes the client and ends its thread; sessions stay.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._sb = Tai42Sandbox(url, token, ssl=ssl)
        self._loop = _Loop()

    def __repr__(self) -> str:
        return repr(self._sb).replace("Tai42Sandbox", "Tai42SandboxSync")

    def connect(self) -> None:
        self._loop.run(self._sb.connect())

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._sb.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> Tai42SandboxSync:
        try:
            self.connect()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def exec_default_timeout_seconds(self) -> float:
        return self._sb.exec_default_timeout_seconds

    @property
    def reap_interval_seconds(self) -> float:
        return self._sb.reap_interval_seconds

    def policy(self) -> SandboxPolicy:
        return self._loop.run(self._sb.policy())

    def create_session(self, spec: SandboxSessionSpec) -> Tai42SessionSync:
        return Tai42SessionSync(self._loop, self._loop.run(self._sb.create_session(spec)))

    def get_session(self, session_id: str) -> Tai42SessionSync:
        return Tai42SessionSync(self._loop, self._loop.run(self._sb.get_session(session_id)))

    def list_sessions(self) -> list[SandboxSessionInfo]:
        return self._loop.run(self._sb.list_sessions())

    def destroy_session(self, session_id: str) -> None:
        self._loop.run(self._sb.destroy_session(session_id))

    def reap(self) -> list[str]:
        return self._loop.run(self._sb.reap())

    def list_workspaces(self) -> list[SandboxWorkspaceInfo]:
        return self._loop.run(self._sb.list_workspaces())

    def remove_workspace(self, key: str) -> None:
        self._loop.run(self._sb.remove_workspace(key))

    def pull_image(
        self,
        ref: str,
        *,
        platform: str | None = None,
        progress: PullProgressCallback | None = None,
    ) -> SandboxImageInfo:
        """Tai42Sandbox.pull_image, blocking; progress runs on the client's
        loop thread."""
        return self._loop.run(self._sb.pull_image(ref, platform=platform, progress=progress))

    def list_images(self) -> list[SandboxImageInfo]:
        return self._loop.run(self._sb.list_images())

    def remove_image(self, name: str) -> None:
        self._loop.run(self._sb.remove_image(name))

    def prune_images(self) -> SandboxPruneResult:
        return self._loop.run(self._sb.prune_images())
