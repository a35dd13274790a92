"""The mutants: each a real sandbox with exactly one bug, injected by a
wrapper at the contract's faces, by the Config its factory is given, or by a
patch of the contract package, and the clauses that must fail on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, SecretStr

from tai42_contract.sandbox import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxExecHandle,
    SandboxExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxOutputLimitError,
    SandboxSession,
    SandboxSessionInfo,
    SandboxSessionNotFoundError,
    SandboxSessionSpec,
    SandboxSpecRejectedError,
    SandboxStreamChunk,
    SandboxStreamExit,
)
from tai42_contract.sandbox import errors as E
from tai42_contract.sandbox import models as M
from tai42_contract.sandbox import policy as P
from tai42_contract.sandbox import registry as R
from tai42_contract.sandbox.testing import Config

from .wrappers import Item, MHandle, MSandbox, MSession, Wrap, wrap


@dataclass(frozen=True)
class Mutant:
    """name; bug, what it does wrong; clauses, every clause that must fail on
    it (and, run on them, the only ones that do); and how the bug is made:
    a wrap of the sandbox, a change of the Config, or a patch of the
    contract package while the clauses run."""

    name: str
    bug: str
    clauses: tuple[str, ...]
    wrap: Wrap | None = None
    config: Callable[[Config], Config] | None = None
    patch: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    daemon: str = "host"
    """The daemon it wraps: "host"; "host-nobody", the host runner run as
    nobody, whose sessions cannot read a file of mode 000; or "host-no-user",
    the host daemon behind UserRefused, a provider without the user
    extension."""


@contextlib.contextmanager
def setattr_(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _result(fn: Callable[[ExecResult], ExecResult]) -> type[MSession]:
    class S(MSession):
        async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
            return fn(await super().exec(argv, **kw))

    return S


def _exec_error(fn: Callable[[BaseException], BaseException]) -> type[MSession]:
    class S(MSession):
        async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
            try:
                return await super().exec(argv, **kw)
            except Exception as e:
                raise fn(e) from None

    return S


def _exit_code(fn: Callable[[int], int]) -> type[MHandle]:
    class H(MHandle):
        async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
            async for it in src:
                yield (
                    SandboxStreamExit(exit_code=fn(it.exit_code))
                    if isinstance(it, SandboxStreamExit)
                    else it
                )

    return H


def _code(frm: int, to: int) -> Callable[[ExecResult], ExecResult]:
    return lambda r: r.model_copy(update={"exit_code": to}) if r.exit_code == frm else r


# Contract package patches.


class _ExecResultNoStderr(BaseModel):
    exit_code: int
    stdout: str


class _LookupFileNotFound(LookupError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(path)


def _swapped_openness(network: str) -> int:
    return {"none": 0, "internal": 2, "egress": 1}[network]


def _revealing_repr(self: SandboxSessionSpec) -> str:
    env = {k: v.get_secret_value() for k, v in self.env.items()}
    return f"SandboxSessionSpec(image={self.image!r}, env={env!r})"


# Sandbox-level bugs.


class ZeroDefault(MSandbox):
    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.exec_default_timeout_seconds = 0.0


class DoubledInterval(MSandbox):
    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.reap_interval_seconds = self.inner.reap_interval_seconds * 2


class SlowReaperReportsConfigured(MSandbox):
    """With the config mutant reaper-slow: reports the cadence asked for."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.reap_interval_seconds = (
            0.1 if self.inner.reap_interval_seconds == 3600 else (self.inner.reap_interval_seconds)
        )


class NotFoundNoId(MSandbox):
    async def get_session(self, session_id: str) -> SandboxSession:
        try:
            return await super().get_session(session_id)
        except SandboxSessionNotFoundError:
            raise SandboxSessionNotFoundError("") from None


class NotFoundRaw(MSandbox):
    async def get_session(self, session_id: str) -> SandboxSession:
        try:
            return await super().get_session(session_id)
        except SandboxSessionNotFoundError as e:
            raise KeyError(str(e)) from None


class DestroyNotIdempotent(MSandbox):
    async def destroy_session(self, session_id: str) -> None:
        await self.inner.get_session(session_id)
        await super().destroy_session(session_id)


class DestroySessionDeferred(MSandbox):
    async def destroy_session(self, session_id: str) -> None:
        async def later() -> None:
            await asyncio.sleep(2)
            await self.inner.destroy_session(session_id)

        self.tasks.append(asyncio.ensure_future(later()))


class ListDropsOne(MSandbox):
    async def list_sessions(self) -> list[SandboxSessionInfo]:
        return (await super().list_sessions())[1:]


class ReapExtraId(MSandbox):
    async def reap(self) -> list[str]:
        ids = await super().reap()
        return [*ids, next(reversed(self.specs))] if self.specs else ids


class ReapDestroysLive(MSandbox):
    async def reap(self) -> list[str]:
        ids = await super().reap()
        for info in await self.inner.list_sessions():
            await self.inner.destroy_session(info.id)
        return ids


class ReapReturnsAllSeen(MSandbox):
    """Every reap returns the ids reaps running beside it destroyed too."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.seen: dict[str, float] = {}

    async def reap(self) -> list[str]:
        ids = await super().reap()
        now = time.monotonic()
        self.seen.update(dict.fromkeys(ids, now))
        await asyncio.sleep(0.05)
        return sorted({*ids, *(i for i, t in self.seen.items() if now - t < 0.2)})


class ReapEarly(MSandbox):
    """reap also destroys the sessions due within 300 ms."""

    async def reap(self) -> list[str]:
        ids = await super().reap()
        for sid, s in list(self.made.items()):
            try:
                info = await s.inner.info()
            except SandboxError:
                continue
            if info.expires_at.timestamp() - time.time() < 0.3:
                await self.inner.destroy_session(sid)
                ids.append(sid)
        return ids


class ExpiredReturned(MSandbox):
    async def get_session(self, session_id: str) -> SandboxSession:
        try:
            return await super().get_session(session_id)
        except SandboxSessionNotFoundError:
            if session_id in self.made:
                return self.made[session_id]
            raise


class ExpiredListed(MSandbox):
    """list_sessions also lists the sessions it made that expired."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.infos: dict[str, SandboxSessionInfo] = {}
        self.destroyed: set[str] = set()

    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        s = await super().create_session(spec)
        self.infos[s.id] = await s.info()
        return s

    async def destroy_session(self, session_id: str) -> None:
        self.destroyed.add(session_id)
        await super().destroy_session(session_id)

    async def list_sessions(self) -> list[SandboxSessionInfo]:
        listed = await super().list_sessions()
        ids = {i.id for i in listed}
        return listed + [
            info for sid, info in self.infos.items() if sid not in ids | self.destroyed
        ]


# Spec and create bugs.


class InvalidRepaired(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        if spec.ttl_seconds <= 0:
            spec = spec.model_copy(update={"ttl_seconds": 600})
        return await super().create_session(spec)


class IsolationDowngraded(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        if spec.isolation is not None and spec.isolation != "none":
            spec = spec.model_copy(update={"isolation": None})
        return await super().create_session(spec)


class NetworkNoneDowngraded(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        if spec.network == "none":
            spec = spec.model_copy(update={"network": "egress"})
        return await super().create_session(spec)


class CapsStripped(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        return await super().create_session(
            spec.model_copy(update={"cpu": None, "memory_mb": None})
        )


class FractionalCPURejected(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        if spec.cpu is not None and spec.cpu != int(spec.cpu):
            raise SandboxSpecRejectedError(
                "a fractional cpu cannot be enforced", field="cpu", reason="unenforceable"
            )
        return await super().create_session(spec)


class EphemeralNotEmpty(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        s = await super().create_session(spec)
        await s.put_file(".left-over", b"x")
        return s


class PersistentDowngraded(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        return await super().create_session(spec.model_copy(update={"durability": "ephemeral"}))


class ConflictDowngraded(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        try:
            return await super().create_session(spec)
        except SandboxSpecRejectedError as e:
            if e.reason != "conflict":
                raise
            return await super().create_session(spec.model_copy(update={"durability": "ephemeral"}))


class ExpiredHoldsKey(MSandbox):
    """A persistent key stays held until its session is reaped or destroyed."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.released: set[str] = set()

    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        if spec.durability == "persistent":
            for sid, old in self.specs.items():
                if old.workspace_key == spec.workspace_key and sid not in self.released:
                    raise SandboxSpecRejectedError(
                        f"workspace_key {spec.workspace_key} is held by {sid}",
                        field="workspace_key",
                        reason="conflict",
                    )
        return await super().create_session(spec)

    async def destroy_session(self, session_id: str) -> None:
        self.released.add(session_id)
        await super().destroy_session(session_id)

    async def reap(self) -> list[str]:
        ids = await super().reap()
        self.released.update(ids)
        return ids


class ReapWipesPersistent(MSandbox):
    async def reap(self) -> list[str]:
        ids = await super().reap()
        for sid in ids:
            spec = self.specs.get(sid)
            if spec is not None and spec.durability == "persistent":
                await self.inner.remove_workspace(spec.workspace_key)  # type: ignore[attr-defined]
        return ids


class _SharedSession(MSession):
    async def get_file(self, path: str) -> bytes:
        if self.spec is not None and self.spec.workspace_key:
            for sid, sp in self.sb.specs.items():
                if sp.workspace_key == self.spec.workspace_key and sid != self.id:
                    with contextlib.suppress(SandboxError):
                        return await self.sb.made[sid].inner.get_file(path)
        return await super().get_file(path)


class EphemeralLeft(MSession):
    async def destroy(self) -> None:
        await super().destroy()
        os.makedirs(self.workspace_path, exist_ok=True)


# Session bugs.


class LabelsDropped(MSandbox):
    async def create_session(self, spec: SandboxSessionSpec) -> SandboxSession:
        return await super().create_session(spec.model_copy(update={"labels": {}}))


class InfoWorkspaceParent(MSession):
    async def info(self) -> SandboxSessionInfo:
        i = await super().info()
        return i.model_copy(update={"workspace_path": os.path.dirname(i.workspace_path)})


class InfoExpiresLate(MSession):
    async def info(self) -> SandboxSessionInfo:
        import datetime

        i = await super().info()
        return i.model_copy(update={"expires_at": i.expires_at + datetime.timedelta(seconds=1)})


class TouchNoop(MSession):
    async def touch(self) -> None:
        await self.inner.info()


class TouchShortens(MSession):
    """touch leaves expires_at a minute short of now + ttl: it touches, then
    reports the life a minute short."""

    async def touch(self) -> None:
        await super().touch()
        self.short = True

    async def info(self) -> SandboxSessionInfo:
        import datetime

        i = await super().info()
        if getattr(self, "short", False):
            return i.model_copy(
                update={"expires_at": i.expires_at - datetime.timedelta(minutes=61)}
            )
        return i


class TouchAccumulates(MSession):
    """touch adds the ttl to the old expires_at rather than to now: each
    touch reports the life an hour (the clause's ttl) longer."""

    async def touch(self) -> None:
        await super().touch()
        self.touches = getattr(self, "touches", 0) + 1

    async def info(self) -> SandboxSessionInfo:
        import datetime

        i = await super().info()
        extra = datetime.timedelta(hours=getattr(self, "touches", 0))
        return i.model_copy(update={"expires_at": i.expires_at + extra})


class DestroyNoop(MSession):
    async def destroy(self) -> None:
        await self.inner.info()


class ExecGonePlain(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        try:
            return await super().exec(argv, **kw)
        except SandboxSessionNotFoundError as e:
            raise SandboxError(f"the exec's connection was lost ({e})") from None


# Exec bugs.


class ArgvJoined(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        return await super().exec(["sh", "-c", " ".join(argv)], **kw)


class BadTimeoutDefaulted(MSession):
    @staticmethod
    def _fix(t: float) -> float:
        return 20.0 if not t > 0 else t

    async def exec(self, argv: Sequence[str], *, timeout_seconds: float, **kw: Any) -> ExecResult:
        return await super().exec(argv, timeout_seconds=self._fix(timeout_seconds), **kw)

    async def exec_start(
        self, argv: Sequence[str], *, timeout_seconds: float, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, timeout_seconds=self._fix(timeout_seconds), **kw)


class TimeoutDefaulted(MSession):
    async def exec(
        self, argv: Sequence[str], *, timeout_seconds: float = 20.0, **kw: Any
    ) -> ExecResult:
        return await super().exec(argv, timeout_seconds=timeout_seconds, **kw)

    async def exec_start(
        self, argv: Sequence[str], *, timeout_seconds: float = 20.0, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, timeout_seconds=timeout_seconds, **kw)


class EmptyArgvRunsTrue(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        return await super().exec(list(argv) or ["true"], **kw)


class TimeoutNoteDropped(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        try:
            return await super().exec(argv, **kw)
        except SandboxExecTimeoutError as e:
            raise SandboxExecTimeoutError(e.timeout_seconds, e.stdout_len, e.stderr_len) from None


def _overlay(
    spec: SandboxSessionSpec | None, env: dict[str, SecretStr] | None
) -> dict[str, SecretStr]:
    return {**(env or {}), **(spec.env if spec else {})}


class EnvReversed(MSession):
    async def exec(self, argv: Sequence[str], *, env: Any = None, **kw: Any) -> ExecResult:
        return await super().exec(argv, env=_overlay(self.spec, env), **kw)

    async def exec_start(
        self, argv: Sequence[str], *, env: Any = None, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, env=_overlay(self.spec, env), **kw)


class HostEnvLeaks(MSession):
    async def exec(self, argv: Sequence[str], *, env: Any = None, **kw: Any) -> ExecResult:
        host = {k: SecretStr(v) for k, v in os.environ.items() if M.valid_env_key(k) is None}
        return await super().exec(argv, env={**host, **(env or {})}, **kw)


class SecretInError(MSession):
    async def exec(self, argv: Sequence[str], *, env: Any = None, **kw: Any) -> ExecResult:
        try:
            return await super().exec(argv, env=env, **kw)
        except SandboxError as e:
            vals = [
                f"{k}={v.get_secret_value()}"
                for src in ((self.spec.env if self.spec else {}), env or {})
                for k, v in src.items()
            ]
            raise SandboxError(f"{e} (env {' '.join(vals)})", op="exec") from e


class SecretInRepr(MSession):
    def __repr__(self) -> str:
        env = {k: v.get_secret_value() for k, v in (self.spec.env if self.spec else {}).items()}
        return f"<session {self.id} env={env}>"


class SecretInLog(MSession):
    async def exec(self, argv: Sequence[str], *, env: Any = None, **kw: Any) -> ExecResult:
        for k, v in (env or {}).items():
            self.sb.cfg.log(f"level=DEBUG msg=exec env={k}={v.get_secret_value()}")
        return await super().exec(argv, env=env, **kw)


class CwdIgnored(MSession):
    async def exec(self, argv: Sequence[str], *, cwd: Any = None, **kw: Any) -> ExecResult:
        return await super().exec(argv, **kw)

    async def exec_start(
        self, argv: Sequence[str], *, cwd: Any = None, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, **kw)


class StdinDropped(MSession):
    async def exec(self, argv: Sequence[str], *, stdin: Any = None, **kw: Any) -> ExecResult:
        return await super().exec(argv, **kw)


class NilStdinNewline(MSession):
    async def exec(self, argv: Sequence[str], *, stdin: Any = None, **kw: Any) -> ExecResult:
        return await super().exec(argv, stdin=stdin or b"\n", **kw)


class WaitsForPipes(MSession):
    """exec returns when its output pipes close, not when the command exits."""

    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        script = 'o=$("$@"; echo x); s=$?; printf %s "${o%x}"; exit $s'
        return await super().exec(["sh", "-c", script, "sh", *argv], **kw)


class OutputLimitTruncated(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        try:
            return await super().exec(argv, **kw)
        except SandboxOutputLimitError as e:
            return ExecResult(exit_code=0, stdout="\0" * e.limit, stderr="")


class ResultsCrossed(MSession):
    """Concurrent execs get each other's results: the last one finished."""

    last: ExecResult | None = None

    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        res = type(self).last = await super().exec(argv, **kw)
        await asyncio.sleep(0.05)
        return type(self).last or res


# Interactive exec bugs.


class ExitTwice(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        async for it in src:
            yield it
            if isinstance(it, SandboxStreamExit):
                yield it


class ExitNever(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        async for it in src:
            if not isinstance(it, SandboxStreamExit):
                yield it


class ChunksReordered(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        held: Item | None = None
        async for it in src:
            if isinstance(it, SandboxStreamChunk) and held is None:
                held = it
                continue
            yield it
            if held is not None:
                yield held
                held = None
        if held is not None:
            yield held


class StreamsSwapped(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        async for it in src:
            if isinstance(it, SandboxStreamChunk):
                it = SandboxStreamChunk(
                    stream="stderr" if it.stream == "stdout" else "stdout", data=it.data
                )
            yield it


def _timeout_error(fn: Callable[[SandboxExecTimeoutError], BaseException]) -> type[MHandle]:
    class H(MHandle):
        async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
            try:
                async for it in src:
                    yield it
            except SandboxExecTimeoutError as e:
                raise fn(e) from None

    return H


class TimeoutSwallowed(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        try:
            async for it in src:
                yield it
        except SandboxExecTimeoutError:
            yield SandboxStreamExit(exit_code=137)


class TimeoutLengthsUndrained(MHandle):
    """The timeout's lengths count only the output yielded before the deadline."""

    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        deadline = self.deadline
        lens = {"stdout": 0, "stderr": 0}
        try:
            async for it in src:
                if isinstance(it, SandboxStreamChunk) and time.monotonic() < deadline:
                    lens[it.stream] += len(it.data)
                yield it
        except SandboxExecTimeoutError as e:
            raise SandboxExecTimeoutError(
                e.timeout_seconds, lens["stdout"], lens["stderr"]
            ) from None


class KillNoop(MHandle):
    async def kill(self) -> None:
        pass


class KillAfterExitRaises(MHandle):
    async def kill(self) -> None:
        if self.exited:
            raise SandboxError("the exec has already exited", op="kill")
        await super().kill()


class KillChangesExit(MHandle):
    async def kill(self) -> None:
        self.killed = True
        await super().kill()

    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        async for it in src:
            if isinstance(it, SandboxStreamExit) and getattr(self, "killed", False):
                it = SandboxStreamExit(exit_code=137)
            yield it


class KillDropsOutput(MHandle):
    async def kill(self) -> None:
        self.killed = True
        await super().kill()

    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        async for it in src:
            if isinstance(it, SandboxStreamChunk) and getattr(self, "killed", False):
                continue
            yield it


class KillReportsTimeout(MHandle):
    async def items(self, src: AsyncIterator[Item]) -> AsyncIterator[Item]:
        deadline = self.deadline
        async for it in src:
            if isinstance(it, SandboxStreamExit) and time.monotonic() > deadline:
                raise SandboxExecTimeoutError(self.timeout, 0, 0)
            yield it


class WriteDropped(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        pass


class WriteWaitsForOutput(MHandle):
    """write_stdin waits for the output's end: a reader and a writer
    deadlock, as on one attach stream without demultiplexing."""

    async def write_stdin(self, data: bytes) -> None:
        await self.done.wait()
        await super().write_stdin(data)


class WriteTruncated(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        await super().write_stdin(data[: 1 << 20])


class CloseNoop(MHandle):
    async def close_stdin(self) -> None:
        pass


class WriteAfterExitNil(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        try:
            await super().write_stdin(data)
        except SandboxError:
            if not self.ended:
                raise


class WriteRaw(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        try:
            await super().write_stdin(data)
        except SandboxError as e:
            raise BrokenPipeError(32, "Broken pipe") from e


class WriteSplit(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        half = len(data) // 2
        await super().write_stdin(data[:half])
        await asyncio.sleep(0.001)
        await super().write_stdin(data[half:])


class WriteAfterCloseNil(MHandle):
    async def close_stdin(self) -> None:
        self.closed = True
        await super().close_stdin()

    async def write_stdin(self, data: bytes) -> None:
        if not getattr(self, "closed", False):
            await super().write_stdin(data)


class CancelWriteHangs(MHandle):
    async def write_stdin(self, data: bytes) -> None:
        try:
            await super().write_stdin(data)
        except asyncio.CancelledError:
            await asyncio.sleep(8)
            raise


class CancelNotKilling(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        inner = asyncio.ensure_future(super().exec(argv, **kw))
        self.sb.tasks.append(inner)
        return await asyncio.shield(inner)


# File bugs.


def _get(fn: Callable[[str, BaseException], bytes | BaseException]) -> type[MSession]:
    """A session whose get_file failures fn maps to bytes or another error."""

    class S(MSession):
        async def get_file(self, path: str) -> bytes:
            try:
                return await super().get_file(path)
            except SandboxError as e:
                out = fn(path, e)
            if isinstance(out, BaseException):
                raise out from None
            return out

    return S


def _plain(e: BaseException) -> bool:
    return type(e) is SandboxError


class FileTruncated(MSession):
    async def get_file(self, path: str) -> bytes:
        return (await super().get_file(path))[:-1]


class NoParents(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        parent = os.path.dirname(path)
        if parent:
            r = await self.inner.exec(["test", "-d", parent], timeout_seconds=20)
            if r.exit_code != 0:
                raise SandboxError(f"put_file {path!r}: no such directory {parent!r}")
        await super().put_file(path, data)


class OverwriteKeepsTail(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        try:
            old = await self.inner.get_file(path)
        except SandboxError:
            old = b""
        await super().put_file(path, data + old[len(data) :])


class PutNotAtomic(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        await super().put_file(path, b"")
        await asyncio.sleep(0.02)
        await super().put_file(path, data)


class AbsoluteRefused(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        if path.startswith("/"):
            raise SandboxError(f"put_file {path!r}: absolute paths are refused")
        await super().put_file(path, data)


class PutElsewhere(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        await super().put_file(path + "~", data)

    async def get_file(self, path: str) -> bytes:
        try:
            return await super().get_file(path + "~")
        except SandboxFileNotFoundError:
            return await super().get_file(path)


class PutOverDirectoryReplaces(MSession):
    async def put_file(self, path: str, data: bytes) -> None:
        try:
            await super().put_file(path, data)
        except SandboxError:
            await self.inner.exec(["rm", "-rf", path], timeout_seconds=20)
            await super().put_file(path, data)


class DanglingNotFound(MSession):
    async def get_file(self, path: str) -> bytes:
        try:
            return await super().get_file(path)
        except SandboxError as e:
            if _plain(e):
                r = await self.inner.exec(["test", "-L", path], timeout_seconds=20)
                if r.exit_code == 0:
                    raise SandboxFileNotFoundError(path) from None
            raise


class NulStripped(MSession):
    async def get_file(self, path: str) -> bytes:
        return await super().get_file(path.replace("\0", ""))

    async def put_file(self, path: str, data: bytes) -> None:
        await super().put_file(path.replace("\0", ""), data)


def _unclimb(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    out: list[str] = []
    for p in parts:
        if p == "..":
            if out:
                out.pop()
        else:
            out.append(p)
    return "/" * path.startswith("/") + "/".join(out)


class EscapeClamped(MSession):
    """A path climbing out is clamped to the workspace, not refused."""

    async def get_file(self, path: str) -> bytes:
        return await super().get_file(_unclimb(path))

    async def put_file(self, path: str, data: bytes) -> None:
        await super().put_file(_unclimb(path), data)


class SymlinkFollowed(MSession):
    """A refused read is retried by cat in the session, following links."""

    async def get_file(self, path: str) -> bytes:
        try:
            return await super().get_file(path)
        except SandboxError as e:
            if not _plain(e) or not path:
                raise
            r = await self.inner.exec(["cat", "--", path], timeout_seconds=20)
            if r.exit_code != 0:
                raise
            return r.stdout.encode(errors="surrogateescape")


class UserIgnored(MSession):
    async def exec(self, argv: Sequence[str], *, user: Any = None, **kw: Any) -> ExecResult:
        return await super().exec(argv, **kw)

    async def exec_start(
        self, argv: Sequence[str], *, user: Any = None, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, **kw)


class UserRefused(MSession):
    """A provider without the user extension: it refuses any user. Not a
    mutant: the base of the daemon "host-no-user"."""

    async def exec(self, argv: Sequence[str], *, user: Any = None, **kw: Any) -> ExecResult:
        if user:
            raise SandboxError(f"this provider runs no exec as a user ({user!r})", op="exec")
        return await super().exec(argv, **kw)

    async def exec_start(
        self, argv: Sequence[str], *, user: Any = None, **kw: Any
    ) -> SandboxExecHandle:
        if user:
            raise SandboxError(f"this provider runs no exec as a user ({user!r})", op="exec")
        return await super().exec_start(argv, **kw)


_WELL_FORMED = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*|[0-9]{1,9}(:[0-9]{1,9})?")


def _user_dropped(keep: Callable[[str], bool]) -> type[MSession]:
    """A session dropping an exec's user (both calls) where keep says no."""

    class S(MSession):
        async def exec(self, argv: Sequence[str], *, user: Any = None, **kw: Any) -> ExecResult:
            if user and keep(user):
                kw["user"] = user
            return await super().exec(argv, **kw)

        async def exec_start(
            self, argv: Sequence[str], *, user: Any = None, **kw: Any
        ) -> SandboxExecHandle:
            if user and keep(user):
                kw["user"] = user
            return await super().exec_start(argv, **kw)

    return S


class UserStartIgnored(MSession):
    async def exec_start(
        self, argv: Sequence[str], *, user: Any = None, **kw: Any
    ) -> SandboxExecHandle:
        return await super().exec_start(argv, **kw)


class UserNotFoundPlain(MSession):
    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        try:
            return await super().exec(argv, **kw)
        except E.SandboxUserNotFoundError as e:
            raise SandboxError(e.message, op="exec") from None


class UserHomeRoot(MSession):
    async def exec(
        self, argv: Sequence[str], *, user: Any = None, env: Any = None, **kw: Any
    ) -> ExecResult:
        if user:
            kw["user"] = user
            spec_env = self.spec.env if self.spec else {}
            if "HOME" not in (env or {}) and "HOME" not in spec_env:
                env = {**(env or {}), "HOME": SecretStr("/root")}
        return await super().exec(argv, env=env, **kw)


# Config bugs.


def _policy(**changes: Any) -> Callable[[Config], Config]:
    def change(cfg: Config) -> Config:
        return replace(cfg, policy=cfg.policy.model_copy(update=changes))

    return change


def _tighter_ceiling(cfg: Config) -> Config:
    tighter = {"egress": "internal", "internal": "none", "none": "none"}
    return replace(cfg, policy=cfg.policy.model_copy(update={"egress": tighter[cfg.policy.egress]}))


def _slow_reaper(cfg: Config) -> Config:
    if cfg.reap_interval_seconds is not None and cfg.reap_interval_seconds < 1:
        return replace(cfg, reap_interval_seconds=3600.0)
    return cfg


def _s(cls: type[MSession]) -> Wrap:
    return wrap(session=cls)


def _h(cls: type[MHandle]) -> Wrap:
    return wrap(handle=cls)


def _sb(cls: type[MSandbox]) -> Wrap:
    return wrap(sandbox=cls)


KILLED = (
    "ExecStart/KillBeforeRead ExecStart/KillTwice ExecStart/KillConcurrent ExecStart/KillDuringRun"
)

MUTANTS: list[Mutant] = [
    # The contract package.
    Mutant(
        "models-execresult-no-stderr",
        "ExecResult has no stderr attribute",
        ("Contract/Models",),
        patch=lambda: setattr_(M, "ExecResult", _ExecResultNoStderr),
    ),
    Mutant(
        "errors-file-not-found-lookup",
        "SandboxFileNotFoundError is a LookupError, not a SandboxError",
        ("Contract/Errors",),
        patch=lambda: setattr_(E, "SandboxFileNotFoundError", _LookupFileNotFound),
    ),
    Mutant(
        "ranks-swapped",
        "network_openness ranks egress below internal",
        ("Contract/PolicyRanks",),
        patch=lambda: setattr_(P, "network_openness", _swapped_openness),
    ),
    Mutant(
        "spec-repr-reveals-env",
        "a spec's repr shows its env values",
        ("Contract/SpecEnvMasked",),
        patch=lambda: setattr_(M.SandboxSessionSpec, "__repr__", _revealing_repr),
    ),
    Mutant(
        "registry-keyerror",
        "require raises KeyError, not SandboxUnavailableError, for a name not registered",
        ("Contract/RegistryFacet",),
        patch=lambda: setattr_(R.SandboxRegistry, "require", _wrapped_require()),
    ),
    Mutant(
        "registry-factory-remade",
        "require_sandbox calls a registered factory anew each time",
        ("Contract/RegistryFacet",),
        patch=lambda: setattr_(R.SandboxRegistry, "require", _uncached_require),
    ),
    # The sandbox.
    Mutant(
        "exec-default-timeout-zero",
        "exec_default_timeout_seconds reports 0",
        ("Sandbox/Defaults",),
        _sb(ZeroDefault),
    ),
    Mutant(
        "reap-interval-doubled",
        "reap_interval_seconds reports twice the cadence configured",
        ("Sandbox/Defaults", "Sandbox/BackgroundReaper"),
        _sb(DoubledInterval),
    ),
    Mutant(
        "reaper-slow",
        "the background reaper runs hourly, not at the cadence asked for (which it reports)",
        ("Sandbox/BackgroundReaper",),
        _sb(SlowReaperReportsConfigured),
        config=_slow_reaper,
    ),
    Mutant(
        "session-not-found-no-id",
        "get_session's SandboxSessionNotFoundError names no session",
        ("Sandbox/GetSession",),
        _sb(NotFoundNoId),
    ),
    Mutant(
        "session-not-found-raw",
        "get_session of an unknown id raises KeyError",
        ("Sandbox/GetSession", "Sandbox/DestroySession", "Session/Destroy", "Session/Expiry"),
        _sb(NotFoundRaw),
    ),
    Mutant(
        "destroy-not-idempotent",
        "destroy_session of a gone id raises SandboxSessionNotFoundError",
        ("Sandbox/DestroySession", "Session/Destroy"),
        _sb(DestroyNotIdempotent),
    ),
    Mutant(
        "list-drops-one",
        "list_sessions leaves out one live session",
        ("Sandbox/ListSessions", "Sandbox/ConcurrentCreate"),
        _sb(ListDropsOne),
    ),
    Mutant(
        "reap-extra-id",
        "reap also returns the id of the last session made, which it did not destroy",
        ("Sandbox/Reap",),
        _sb(ReapExtraId),
    ),
    Mutant(
        "reap-destroys-live",
        "reap also destroys the live sessions (returning only the expired ids)",
        ("Sandbox/Reap", "Sandbox/ConcurrentReap"),
        _sb(ReapDestroysLive),
    ),
    Mutant(
        "reap-returns-all-seen",
        "every reap returns the expired ids the reaps beside it destroyed",
        ("Sandbox/ConcurrentReap",),
        _sb(ReapReturnsAllSeen),
    ),
    Mutant(
        "reap-early",
        "reap also destroys the sessions due to expire within 300 ms",
        ("Sandbox/ReapNotEarly",),
        _sb(ReapEarly),
    ),
    # The spec.
    Mutant(
        "invalid-ttl-repaired",
        "a spec of ttl_seconds 0 or less is made with 600, not rejected",
        ("Spec/Invalid",),
        _sb(InvalidRepaired),
    ),
    Mutant(
        "policy-floor-ignored",
        "the isolation floor of the policy is not enforced",
        ("Spec/Policy",),
        config=_policy(isolation="none"),
    ),
    Mutant(
        "policy-ceiling-ignored",
        "a network above the policy's egress ceiling is accepted",
        ("Spec/Policy",),
        config=_policy(egress="egress"),
    ),
    Mutant(
        "policy-durable-ignored",
        "a persistent session is accepted while the policy's durable is off",
        ("Spec/Policy",),
        config=_policy(durable=True),
    ),
    Mutant(
        "isolation-downgraded",
        "a stronger isolation than the provider's is silently made its own",
        ("Spec/Unenforceable",),
        _sb(IsolationDowngraded),
    ),
    Mutant(
        "ceiling-off-by-one",
        "a network at the egress ceiling is rejected (the ceiling compared with <)",
        ("Spec/Accepted",),
        config=_tighter_ceiling,
    ),
    Mutant(
        "network-none-downgraded",
        "network none is silently made egress",
        ("Spec/NetworkNone",),
        _sb(NetworkNoneDowngraded),
    ),
    Mutant(
        "caps-stripped",
        "cpu and memory_mb are dropped from the spec: no cap is applied",
        ("Spec/MemoryCap",),
        _sb(CapsStripped),
    ),
    Mutant(
        "fractional-cpu-rejected",
        "a fractional cpu is rejected as unenforceable",
        ("Spec/CPUCap", "Spec/CPUCapThrottles"),
        _sb(FractionalCPURejected),
    ),
    # Sessions.
    Mutant(
        "labels-dropped",
        "a session's labels are dropped at create",
        ("Session/Info", "Sandbox/ListSessions"),
        _sb(LabelsDropped),
    ),
    Mutant(
        "info-workspace-parent",
        "info() reports the workspace's parent as workspace_path",
        ("Session/Info", "Sandbox/ListSessions"),
        _s(InfoWorkspaceParent),
    ),
    Mutant(
        "info-expires-late",
        "info() reports expires_at a second late",
        ("Session/Info",),
        _s(InfoExpiresLate),
    ),
    Mutant("touch-noop", "touch() extends nothing", ("Session/Touch",), _s(TouchNoop)),
    Mutant(
        "touch-shortens",
        "after touch() expires_at is a minute short of now + ttl",
        ("Session/Touch",),
        _s(TouchShortens),
    ),
    Mutant(
        "touch-accumulates",
        "touch() adds the ttl to the old expires_at: touches accumulate",
        ("Session/Touch",),
        _s(TouchAccumulates),
    ),
    Mutant(
        "expired-returned",
        "get_session returns an expired session the sandbox made",
        ("Session/Expiry",),
        _sb(ExpiredReturned),
    ),
    Mutant(
        "expired-listed",
        "list_sessions also lists the expired sessions not destroyed through it",
        ("Session/Expiry",),
        _sb(ExpiredListed),
    ),
    Mutant(
        "destroy-noop", "destroy() of a session does nothing", ("Session/Destroy",), _s(DestroyNoop)
    ),
    Mutant(
        "exec-gone-plain",
        "an exec of a destroyed session raises a base SandboxError, not SessionNotFound",
        ("Session/DestroyEndsExecs", "Session/ConcurrentDestroyAndExec"),
        _s(ExecGonePlain),
    ),
    Mutant(
        "destroy-deferred",
        "destroy_session returns at once and tears the session down 2 s later",
        ("Session/DestroyEndsLeftovers",),
        _sb(DestroySessionDeferred),
    ),
    # Durability.
    Mutant(
        "ephemeral-not-empty",
        "a new ephemeral workspace holds a file",
        ("Durability/EphemeralEmpty",),
        _sb(EphemeralNotEmpty),
    ),
    Mutant(
        "ephemeral-shared",
        "ephemeral sessions of one workspace_key read each other's files",
        ("Durability/EphemeralNotShared",),
        _s(_SharedSession),
    ),
    Mutant(
        "ephemeral-left",
        "an ephemeral workspace is left on the host after destroy()",
        ("Durability/EphemeralRemoved",),
        _s(EphemeralLeft),
    ),
    Mutant(
        "persistent-downgraded",
        "a persistent session is made ephemeral",
        ("Durability/Persistent",),
        _sb(PersistentDowngraded),
    ),
    Mutant(
        "conflict-downgraded",
        "a persistent spec whose key is held is silently made ephemeral",
        ("Durability/PersistentConflict",),
        _sb(ConflictDowngraded),
    ),
    Mutant(
        "reap-wipes-persistent",
        "reaping a persistent session removes its workspace",
        ("Durability/PersistentSurvivesReap",),
        _sb(ReapWipesPersistent),
    ),
    Mutant(
        "expired-holds-key",
        "an expired session's persistent key stays held until a reap",
        ("Durability/PersistentExpiredIsNotLive",),
        _sb(ExpiredHoldsKey),
    ),
    # Exec.
    Mutant(
        "exec-exit-code-1",
        "exec reports every non-zero exit code as 1",
        ("Exec/ExitCode",),
        _s(_result(lambda r: r.model_copy(update={"exit_code": 1}) if r.exit_code else r)),
    ),
    Mutant(
        "exec-streams-swapped",
        "exec returns stdout as stderr and stderr as stdout",
        ("Exec/ExitCode",),
        _s(_result(lambda r: r.model_copy(update={"stdout": r.stderr, "stderr": r.stdout}))),
    ),
    Mutant(
        "argv-joined", "argv is joined into one shell command line", ("Exec/Argv",), _s(ArgvJoined)
    ),
    Mutant(
        "exec-signal-code",
        "a command killed by SIGKILL reports 9, not 128+9",
        ("Exec/Signal",),
        _s(_result(_code(137, 9))),
    ),
    Mutant(
        "exec-not-found-code",
        "a command that cannot be found reports 1, not 127",
        ("Exec/NotFound",),
        _s(_result(_code(127, 1))),
    ),
    Mutant(
        "exec-not-executable-code",
        "a command that cannot be executed reports 127, not 126",
        ("Exec/NotExecutable",),
        _s(_result(_code(126, 127))),
    ),
    Mutant(
        "bad-timeout-defaulted",
        "a timeout of 0, less or NaN is taken as 20 s, not refused",
        ("Exec/BadTimeout",),
        _s(BadTimeoutDefaulted),
    ),
    Mutant(
        "timeout-defaulted",
        "timeout_seconds defaults to 20 s instead of being required",
        ("Exec/TimeoutRequired",),
        _s(TimeoutDefaulted),
    ),
    Mutant(
        "empty-argv-runs-true",
        "an empty argv runs true instead of being refused",
        ("Exec/EmptyArgv",),
        _s(EmptyArgvRunsTrue),
    ),
    Mutant(
        "exec-timeout-stdout-len",
        "SandboxExecTimeoutError.stdout_len is one more than the bytes produced",
        ("Exec/Timeout",),
        _s(
            _exec_error(
                lambda e: (
                    SandboxExecTimeoutError(e.timeout_seconds, e.stdout_len + 1, e.stderr_len)
                    if isinstance(e, SandboxExecTimeoutError)
                    else e
                )
            )
        ),
    ),
    Mutant(
        "timeout-note-dropped",
        "the SandboxExecTimeoutError's note is dropped",
        ("Exec/TimeoutHeldOutput",),
        _s(TimeoutNoteDropped),
    ),
    Mutant(
        "env-precedence-reversed",
        "the spec's env wins over the exec's on a collision",
        ("Exec/Env", "ExecStart/CwdAndEnv"),
        _s(EnvReversed),
    ),
    Mutant(
        "host-env-leaks",
        "an exec inherits the host's environment under its own",
        ("Exec/Env",),
        _s(HostEnvLeaks),
    ),
    Mutant(
        "secret-in-error",
        "an exec's error text quotes the session's and the exec's env values",
        ("Exec/SecretsNotInErrors",),
        _s(SecretInError),
    ),
    Mutant(
        "secret-in-repr",
        "a session's repr shows its spec's env values",
        ("Exec/SecretsNotInRepr",),
        _s(SecretInRepr),
    ),
    Mutant(
        "secret-in-log",
        "every exec logs its env values to the provider's log",
        ("Exec/SecretsNotInLogs",),
        _s(SecretInLog),
    ),
    Mutant(
        "cwd-ignored",
        "an exec's cwd is ignored: it runs in the workspace",
        ("Exec/Cwd", "ExecStart/CwdAndEnv"),
        _s(CwdIgnored),
    ),
    Mutant(
        "exec-stdin-dropped",
        "exec gives the command an empty stdin, whatever stdin holds",
        ("Exec/Stdin",),
        _s(StdinDropped),
    ),
    Mutant(
        "nil-stdin-newline",
        "a stdin of None or b'' is sent as a newline",
        ("Exec/NilStdin",),
        _s(NilStdinNewline),
    ),
    Mutant(
        "exec-waits-for-pipes",
        "exec returns when the output pipes close, not when the command exits",
        ("Exec/LeftoverChild",),
        _s(WaitsForPipes),
    ),
    Mutant(
        "output-limit-truncated",
        "an output past the limit is returned truncated with no error",
        ("Exec/OutputLimit",),
        _s(OutputLimitTruncated),
    ),
    Mutant(
        "output-limit-stderr-len",
        "SandboxOutputLimitError.stderr_len is one more than the bytes received",
        ("Exec/OutputLimit",),
        _s(
            _exec_error(
                lambda e: (
                    SandboxOutputLimitError(e.limit, e.stdout_len, e.stderr_len + 1)
                    if isinstance(e, SandboxOutputLimitError)
                    else e
                )
            )
        ),
    ),
    Mutant(
        "results-crossed",
        "concurrent execs get the result of the one that finished last",
        ("Exec/Concurrent",),
        _s(ResultsCrossed),
    ),
    # Interactive execs.
    Mutant(
        "stream-exit-code",
        "the SandboxStreamExit carries the exit code plus one",
        ("ExecStart/ExitCode",),
        _h(_exit_code(lambda c: c + 1 if c else c)),
    ),
    Mutant(
        "stream-killed-status",
        "a killed exec's SandboxStreamExit carries 1, not 128+9",
        tuple(KILLED.split()),
        _h(_exit_code(lambda c: 1 if c == 137 else c)),
    ),
    Mutant(
        "stream-not-found-code",
        "a command that cannot be found ends its output with 1, not 127",
        ("ExecStart/NotFound",),
        _h(_exit_code(lambda c: 1 if c == 127 else c)),
    ),
    Mutant(
        "stream-exit-twice",
        "the SandboxStreamExit is yielded twice",
        ("ExecStart/Interleaved", "ExecStart/ExitCode"),
        _h(ExitTwice),
    ),
    Mutant(
        "stream-exit-never",
        "the output ends without its SandboxStreamExit",
        ("ExecStart/Interleaved", "ExecStart/ExitCode"),
        _h(ExitNever),
    ),
    Mutant(
        "stream-chunks-reordered",
        "each chunk is yielded after the item that follows it",
        ("ExecStart/Interleaved",),
        _h(ChunksReordered),
    ),
    Mutant(
        "stream-streams-swapped",
        "stdout chunks are labelled stderr and stderr chunks stdout",
        ("ExecStart/Interleaved",),
        _h(StreamsSwapped),
    ),
    Mutant(
        "stream-timeout-stderr-len",
        "the output's SandboxExecTimeoutError.stderr_len is one less",
        ("ExecStart/Timeout",),
        _h(
            _timeout_error(
                lambda e: SandboxExecTimeoutError(e.timeout_seconds, e.stdout_len, e.stderr_len - 1)
            )
        ),
    ),
    Mutant(
        "stream-timeout-plain",
        "the output's timeout is a base SandboxError, not a SandboxExecTimeoutError",
        ("ExecStart/Timeout", "ExecStart/TimeoutLengths"),
        _h(_timeout_error(lambda e: SandboxError(str(e)))),
    ),
    Mutant(
        "stream-timeout-swallowed",
        "a timed-out exec's output ends with a SandboxStreamExit 137, raising nothing",
        ("ExecStart/Timeout", "ExecStart/TimeoutLengths"),
        _h(TimeoutSwallowed),
    ),
    Mutant(
        "timeout-lengths-undrained",
        "the timeout's lengths count only the output yielded before the deadline",
        ("ExecStart/TimeoutLengths",),
        _h(TimeoutLengthsUndrained),
    ),
    Mutant(
        "kill-noop",
        "kill() does nothing",
        (
            "ExecStart/KillBeforeRead",
            "ExecStart/KillDuringRun",
            "ExecStart/KillPastDeadline",
            "ExecStart/KillTwice",
            "ExecStart/KillConcurrent",
            "ExecStart/KillKeepsReceivedOutput",
        ),
        _h(KillNoop),
    ),
    Mutant(
        "kill-after-exit-raises",
        "kill() after the exit item went by raises",
        ("ExecStart/KillAfterExit", "ExecStart/WriteAfterExit", "ExecStart/KillConcurrent"),
        _h(KillAfterExitRaises),
    ),
    Mutant(
        "kill-changes-exit",
        "kill() after the exec exited makes its exit status the kill's",
        ("ExecStart/KillAfterExit",),
        _h(KillChangesExit),
    ),
    Mutant(
        "kill-drops-output",
        "once kill() is called the output not yet read is dropped",
        ("ExecStart/KillKeepsReceivedOutput", "ExecStart/KillPastDeadline"),
        _h(KillDropsOutput),
    ),
    Mutant(
        "kill-reports-timeout",
        "an output killed before its deadline but read past it raises a timeout",
        ("ExecStart/KillDuringRun", "ExecStart/KillPastDeadline"),
        _h(KillReportsTimeout),
    ),
    Mutant(
        "write-stdin-dropped",
        "write_stdin delivers nothing",
        ("ExecStart/StdinConcurrent", "ExecStart/StdinLargeWrite", "ExecStart/WritersAtomic"),
        _h(WriteDropped),
    ),
    Mutant(
        "write-waits-for-output",
        "write_stdin waits for the output's end: writer and reader deadlock",
        ("ExecStart/StdinConcurrent",),
        _h(WriteWaitsForOutput),
    ),
    Mutant(
        "write-truncated",
        "a write_stdin past 1 MiB delivers its first MiB only",
        ("ExecStart/StdinLargeWrite",),
        _h(WriteTruncated),
    ),
    Mutant(
        "close-stdin-noop", "close_stdin does nothing", ("ExecStart/CloseStdin",), _h(CloseNoop)
    ),
    Mutant(
        "write-after-exit-nil",
        "write_stdin after the output ended returns None",
        ("ExecStart/WriteAfterExit",),
        _h(WriteAfterExitNil),
    ),
    Mutant(
        "write-raw-error",
        "a refused write_stdin raises BrokenPipeError, not a SandboxError",
        ("ExecStart/WriteAfterExit", "ExecStart/WriteRacingExit"),
        _h(WriteRaw),
    ),
    Mutant(
        "write-stdin-split",
        "write_stdin delivers its data in two writes, so concurrent writes interleave",
        ("ExecStart/WritersAtomic",),
        _h(WriteSplit),
    ),
    Mutant(
        "write-after-close-nil",
        "write_stdin after close_stdin returns None, the input dropped",
        ("ExecStart/WriteAfterClose",),
        _h(WriteAfterCloseNil),
    ),
    # Cancel.
    Mutant(
        "cancel-not-killing",
        "a cancelled exec leaves its command running",
        ("Cancel/Exec",),
        _s(CancelNotKilling),
    ),
    Mutant(
        "cancel-write-hangs",
        "a cancelled write_stdin keeps its task for 8 s",
        ("Cancel/WriteStdin",),
        _h(CancelWriteHangs),
    ),
    # Files.
    Mutant(
        "file-truncated",
        "get_file returns the file without its last byte",
        ("Files/RoundTrip",),
        _s(FileTruncated),
    ),
    Mutant(
        "file-no-parents",
        "put_file fails when the parent directory does not exist",
        ("Files/Parents",),
        _s(NoParents),
    ),
    Mutant(
        "file-overwrite-keeps-tail",
        "put_file over a longer file keeps the old file's tail",
        ("Files/Overwrite",),
        _s(OverwriteKeepsTail),
    ),
    Mutant(
        "file-put-not-atomic",
        "put_file empties the file, then writes the data",
        ("Files/AtomicReplace",),
        _s(PutNotAtomic),
    ),
    Mutant(
        "file-absolute-refused",
        "an absolute path inside the workspace is refused",
        ("Files/AbsoluteInside",),
        _s(AbsoluteRefused),
    ),
    Mutant(
        "file-put-elsewhere",
        "put_file writes beside the path, where get_file reads it back",
        ("Files/SharedWithExec",),
        _s(PutElsewhere),
    ),
    Mutant(
        "file-missing-plain-error",
        "a missing file is a base SandboxError, not a SandboxFileNotFoundError",
        ("Files/NotFound", "Durability/EphemeralNotShared"),
        _s(
            _get(
                lambda p, e: SandboxError(str(e)) if isinstance(e, SandboxFileNotFoundError) else e
            )
        ),
    ),
    Mutant(
        "file-not-found-builtin",
        "a missing file raises the builtin FileNotFoundError",
        ("Files/NotFound",),
        _s(
            _get(
                lambda p, e: (
                    FileNotFoundError(2, str(e)) if isinstance(e, SandboxFileNotFoundError) else e
                )
            )
        ),
    ),
    Mutant(
        "file-not-found-no-path",
        "SandboxFileNotFoundError.path is empty",
        ("Files/NotFound",),
        _s(
            _get(
                lambda p, e: (
                    SandboxFileNotFoundError("") if isinstance(e, SandboxFileNotFoundError) else e
                )
            )
        ),
    ),
    Mutant(
        "file-directory-not-found",
        "get_file of a directory (any base failure) is a SandboxFileNotFoundError",
        ("Files/Directory",),
        _s(_get(lambda p, e: SandboxFileNotFoundError(p) if _plain(e) else e)),
    ),
    Mutant(
        "file-errors-empty",
        "get_file of what cannot be read as a file returns no bytes and no error",
        ("Files/Directory", "Files/Unreadable"),
        _s(_get(lambda p, e: b"" if _plain(e) else e)),
    ),
    Mutant(
        "file-errors-unnamed",
        "a get_file failure's message does not name the path",
        ("Files/Directory",),
        _s(_get(lambda p, e: SandboxError("cannot read it") if _plain(e) else e)),
    ),
    Mutant(
        "file-put-over-directory",
        "put_file onto a directory removes the directory and writes the file",
        ("Files/PutOverDirectory",),
        _s(PutOverDirectoryReplaces),
    ),
    Mutant(
        "dangling-symlink-not-found",
        "get_file of a dangling symlink is a SandboxFileNotFoundError",
        ("Files/DanglingSymlink",),
        _s(DanglingNotFound),
    ),
    Mutant(
        "file-nul-stripped",
        "a path holding a NUL byte is used without it instead of being refused",
        ("Files/BadPaths",),
        _s(NulStripped),
    ),
    Mutant(
        "file-escape-clamped",
        "a path climbing out of the workspace is clamped into it, not refused",
        ("Files/Escapes",),
        _s(EscapeClamped),
    ),
    Mutant(
        "file-symlink-followed",
        "a refused get_file is read again by cat in the session, following links",
        ("Files/SymlinkEscapes",),
        _s(SymlinkFollowed),
    ),
    Mutant(
        "permission-not-found",
        "a permission failure is reported as a SandboxFileNotFoundError",
        ("Files/PermissionDenied",),
        _s(_get(lambda p, e: SandboxFileNotFoundError(p) if _plain(e) else e)),
        daemon="host-nobody",
    ),
    # The user extension.
    Mutant(
        "user-ignored",
        "an exec's user is dropped: it runs as the session's default user",
        ("User/Name", "User/UID", "User/Home", "User/ExecStart", "User/Unknown", "User/Malformed"),
        _s(UserIgnored),
    ),
    Mutant(
        "user-malformed-default",
        "a malformed user is taken for the default user instead of refused",
        ("User/Malformed",),
        _s(_user_dropped(lambda u: _WELL_FORMED.fullmatch(u) is not None)),
    ),
    Mutant(
        "user-uid-as-default",
        "an exec as a uid or uid:gid runs as the default user",
        ("User/UID",),
        _s(_user_dropped(lambda u: not u.split(":")[0].isdigit())),
    ),
    Mutant(
        "user-start-ignored",
        "exec_start drops its user: the interactive exec runs as the default user",
        ("User/ExecStart",),
        _s(UserStartIgnored),
    ),
    Mutant(
        "user-not-found-plain",
        "a SandboxUserNotFoundError is a base SandboxError with the same text",
        ("User/Unknown",),
        _s(UserNotFoundPlain),
    ),
    Mutant(
        "user-home-root",
        "an exec as a user keeps root's HOME",
        ("User/Home", "User/Name"),
        _s(UserHomeRoot),
    ),
    Mutant(
        "user-unsupported-runs",
        "a provider that runs no exec as a user runs one as its default user",
        ("User/Refused",),
        _s(UserIgnored),
        daemon="host-no-user",
    ),
]


def _uncached_require(self: R.SandboxRegistry, name: str | None = None) -> Any:
    """require that makes a registered factory's sandbox anew each time."""
    entry = self._entries.get(name or "")
    if entry is not None and not isinstance(entry, Sandbox):
        return entry()
    return _ORIG_REQUIRE(self, name)


_ORIG_REQUIRE = R.SandboxRegistry.require


def _wrapped_require() -> Any:
    orig = R.SandboxRegistry.require

    def require(self: R.SandboxRegistry, name: str | None = None) -> Any:
        names = self.names()
        if not names or (name and name not in names):
            raise KeyError(name)
        return orig(self, name)

    return require


PENDING: dict[str, str] = {
    "ExecStart/KillStopsLeftovers": (
        "both providers end the processes a command left running at its exit, before any "
        "kill: the clause skips, nothing is left for kill to stop"
    ),
}
"""The clauses no mutant here can fail, with the reason."""
