"""What the clauses share: calls that fail the clause, the error checks, the
stream reader, and small utilities."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr

from .. import errors as E
from ..base import SandboxExecHandle, SandboxSession
from ..models import ExecResult, SandboxStreamChunk, SandboxStreamExit
from ._suite import Check

T = TypeVar("T")

EXEC_TIMEOUT = 20.0
"""The timeout of an ordinary exec."""
PROMPT = 5.0
"""How soon something the contract says ends "promptly" must end."""
KILL_PROMPT = 2.0
"""How soon a stream must end once kill has returned."""
KILL_EXIT = 137
"""The exit status of a killed exec: 128 + SIGKILL."""


async def attempt(aw: Awaitable[T]) -> tuple[T | None, Exception | None]:
    """The result of aw, or the exception it raised."""
    try:
        return await aw, None
    except Exception as e:
        return None, e


async def attempt_call(
    fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
) -> tuple[T | None, Exception | None]:
    """The result of awaiting fn(*args, **kwargs), or the exception its call
    or its awaiting raised (a call with a missing argument raises at once)."""
    try:
        return await fn(*args, **kwargs), None
    except Exception as e:
        return None, e


def sh_argv(script: str, *args: str) -> list[str]:
    """The argv of ``sh -c script sh args...``."""
    return ["sh", "-c", script, "sh", *args]


async def run(
    c: Check, sess: SandboxSession, argv: Sequence[str], *, timeout: float = EXEC_TIMEOUT, **kw: Any
) -> ExecResult:
    """Run argv to completion; an error fails the clause."""
    try:
        res = await sess.exec(argv, timeout_seconds=timeout, **kw)
    except Exception as e:
        c.fatal(f"exec({list(argv)!r}): {e!r}")
    if not isinstance(res, ExecResult):
        c.fatal(f"exec({list(argv)!r}) returned {res!r}, not an ExecResult")
    return res


async def must_sh(c: Check, sess: SandboxSession, script: str, *args: str) -> str:
    """Run a shell script the clause needs to succeed; its stdout."""
    res = await run(c, sess, sh_argv(script, *args))
    if res.exit_code != 0:
        c.fatal(
            f"sh -c {script!r}: exit code {res.exit_code}, stderr {res.stderr!r}; "
            "the suite needs this command to succeed"
        )
    return res.stdout


async def exists(c: Check, sess: SandboxSession, path: str) -> bool:
    """Whether path exists in the session's filesystem (a symlink or else)."""
    res = await run(c, sess, sh_argv('[ -e "$1" ] || [ -L "$1" ]', path))
    return res.exit_code == 0


async def alive(c: Check, sess: SandboxSession, pid: str) -> bool:
    """Whether pid runs in the session (a zombie does not count)."""
    res = await run(
        c,
        sess,
        sh_argv(
            'kill -0 "$1" 2>/dev/null || exit 1\n'
            'case "$(cat "/proc/$1/stat" 2>/dev/null)" in *") Z "*) exit 1;; esac',
            pid,
        ),
    )
    return res.exit_code == 0


async def must_put(c: Check, sess: SandboxSession, path: str, data: bytes) -> None:
    try:
        await sess.put_file(path, data)
    except Exception as e:
        c.fatal(f"put_file({path!r}): {e!r}")


async def must_get(c: Check, sess: SandboxSession, path: str) -> bytes:
    try:
        data = await sess.get_file(path)
    except Exception as e:
        c.fatal(f"get_file({path!r}): {e!r}")
    if not isinstance(data, bytes):
        c.fatal(f"get_file({path!r}) returned {type(data).__name__}, not bytes")
    return data


# The host side of a provider whose sessions share the host's filesystem:
# quick local calls, kept out of the async clauses.


def host_exists(path: str) -> bool:
    return os.path.lexists(path)


def host_isdir(path: str) -> bool:
    return os.path.isdir(path)


def host_read(path: str) -> str:
    with open(path) as f:
        return f.read()


def host_entries(path: str) -> int:
    return len(os.listdir(path))


def secret_env(**values: str) -> dict[str, SecretStr]:
    return {k: SecretStr(v) for k, v in values.items()}


def secret_value(name: str) -> str:
    """A distinctive value to pass as a secret."""
    return f"tai42-secret-{name}-{secrets.token_hex(5)}"


def random_bytes(n: int) -> bytes:
    return os.urandom(n)


def random_text(n: int) -> str:
    """n characters of random text, multi-byte UTF-8 among them: input an
    exec echoes back as str."""
    rnd = random.Random(n)
    return "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz0123456789 \n\t\"'$\\*éßπ漢😀", k=n))


async def sleep_until(deadline: float) -> None:
    """Sleep until time.time() reaches deadline (a wall-clock time)."""
    delay = deadline - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def eventually(seconds: float, cond: Callable[[], Awaitable[bool]]) -> bool:
    """Poll cond every 50 ms until it holds or seconds have passed."""
    end = time.monotonic() + seconds
    while True:
        if await cond():
            return True
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.05)


async def wait_expired(c: Check, *sessions: SandboxSession) -> None:
    """Sleep until every session has passed its expires_at."""
    last = 0.0
    for sess in sessions:
        info, err = await attempt(sess.info())
        if isinstance(err, E.SandboxSessionNotFoundError):
            continue  # expired already, on a machine slow enough
        if err is not None or info is None:
            c.fatal(f"info() of a live session: {err!r}")
        last = max(last, info.expires_at.timestamp())
    await sleep_until(last + 0.1)


# The error kinds of the family, each more specific than SandboxError.
KINDS: tuple[type[E.SandboxError], ...] = (
    E.SandboxExecTimeoutError,
    E.SandboxFileNotFoundError,
    E.SandboxSessionNotFoundError,
    E.SandboxSpecRejectedError,
    E.SandboxUnavailableError,
    E.SandboxOutputLimitError,
    E.SandboxUserNotFoundError,
    E.SandboxWorkspaceNotFoundError,
)


def want_kind(c: Check, err: BaseException | None, kind: type[E.SandboxError], what: str) -> bool:
    """Fail unless err is of the family and of kind."""
    if err is None:
        c.error(f"{what}: got no error; want a {kind.__name__}")
        return False
    if not isinstance(err, E.SandboxError):
        c.error(
            f"{what}: got {type(err).__name__} {err!r}; every contract error is a "
            f"SandboxError (want a {kind.__name__})"
        )
        return False
    if not isinstance(err, kind):
        c.error(f"{what}: got {type(err).__name__} {err}; want a {kind.__name__}")
        return False
    return True


def want_plain(c: Check, err: BaseException | None, what: str) -> bool:
    """Fail unless err is a base SandboxError of no more specific kind (in
    particular no SandboxFileNotFoundError)."""
    if not want_kind(c, err, E.SandboxError, what):
        return False
    for k in KINDS:
        if isinstance(err, k):
            c.error(
                f"{what}: got a {k.__name__} ({err}); want the base SandboxError carrying the "
                "real failure"
            )
            return False
    return True


def names_path(err: BaseException, path: str) -> bool:
    msg = str(err)
    return path in msg or repr(path)[1:-1] in msg or path.encode("unicode_escape").decode() in msg


def want_plain_path(c: Check, err: BaseException | None, path: str, what: str) -> None:
    """want_plain, and the message names path."""
    if want_plain(c, err, what) and err is not None and path and not names_path(err, path):
        c.error(
            f"{what}: the message {str(err)!r} does not name the path {path!r}; a file error "
            "names the path it was given"
        )


def want_gone(c: Check, err: BaseException | None, session_id: str, what: str) -> None:
    """Fail unless err is a SandboxSessionNotFoundError for session_id."""
    if not want_kind(c, err, E.SandboxSessionNotFoundError, what):
        return
    got = getattr(err, "session_id", None)
    if got != session_id:
        c.error(f"{what}: SandboxSessionNotFoundError.session_id = {got!r}; want {session_id!r}")


def want_rejected(c: Check, err: BaseException | None, reason: str, field: str, what: str) -> None:
    """Fail unless err is a SandboxSpecRejectedError of reason for field,
    whose message names the field, and, for the two causes the contract
    names, which of them it is."""
    if not want_kind(c, err, E.SandboxSpecRejectedError, what):
        return
    assert isinstance(err, E.SandboxSpecRejectedError)
    got_reason, got_field = getattr(err, "reason", None), getattr(err, "field", None)
    if got_reason != reason:
        c.error(f"{what}: reason {got_reason!r}; want {reason!r} ({err})")
    if field and got_field != field:
        c.error(f"{what}: field {got_field!r}; want {field!r} ({err})")
    msg = str(err)
    if field and field not in msg:
        c.error(f"{what}: the message {msg!r} does not name the field {field!r}")
    if reason == "policy" and "polic" not in msg.lower():
        c.error(f"{what}: the message {msg!r} does not say that the operator policy refused it")
    if reason == "unenforceable" and "polic" in msg.lower():
        c.error(
            f"{what}: the message {msg!r} names the policy; the provider cannot enforce this "
            "spec, and the message says which cause it is"
        )


def printed_forms(v: object) -> list[str]:
    """Every way v prints: str, repr, and for a model its dumps, for an
    error its args and the errors it chains to."""
    forms = [str(v), repr(v)]
    if isinstance(v, BaseModel):
        forms += [repr(v.model_dump()), v.model_dump_json()]
    if isinstance(v, (list, tuple)):
        for x in v:
            forms += printed_forms(x)
    if isinstance(v, BaseException):
        forms += [repr(a) for a in v.args]
        forms += [repr(vars(v))] if hasattr(v, "__dict__") else []
        seen = {id(v)}
        e: BaseException | None = v.__cause__ or v.__context__
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            forms += [str(e), repr(e), *(repr(a) for a in e.args)]
            e = e.__cause__ or e.__context__
    return forms


def no_secret(c: Check, what: str, v: object, *values: str) -> None:
    """Fail if any printed form of v shows one of the secret values."""
    for f in printed_forms(v):
        for s in values:
            if s in f:
                c.error(
                    f"{what} shows an env value: {f[:300]!r}; env values are secrets and never "
                    "appear in errors, logs, reprs or info"
                )
                return


class Reader:
    """Reads one exec handle's output and checks its shape: chunks of
    stdout or stderr, then exactly one SandboxStreamExit, then the end; or
    an error ending it."""

    def __init__(self, c: Check, h: SandboxExecHandle) -> None:
        self.c = c
        self.h = h
        self.it = h.output
        self.chunks: list[SandboxStreamChunk] = []
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit: SandboxStreamExit | None = None
        self.err: Exception | None = None
        self.ended = False

    async def next(self) -> bool:
        """Read one item; False once the stream has ended."""
        c = self.c
        if self.ended:
            return False
        try:
            item = await anext(self.it)
        except StopAsyncIteration:
            self.ended = True
            if self.exit is None:
                c.error(
                    "the output ended before any SandboxStreamExit; the stream ends with "
                    "exactly one SandboxStreamExit"
                )
            return False
        except Exception as e:
            self.ended = True
            self.err = e
            if self.exit is not None:
                c.error(f"the output raised {e!r} after the SandboxStreamExit; want its end")
            return False
        if self.exit is not None:
            c.error(f"the output yielded {item!r} after the SandboxStreamExit, which is the last")
        if isinstance(item, SandboxStreamChunk):
            if item.stream == "stdout":
                self.stdout += item.data
            elif item.stream == "stderr":
                self.stderr += item.data
            else:
                c.error(f"the output yielded a chunk of stream {item.stream!r}")
            self.chunks.append(item)
        elif isinstance(item, SandboxStreamExit):
            if self.exit is None:
                self.exit = item
        else:
            c.error(
                f"the output yielded {item!r}; want a SandboxStreamChunk or a SandboxStreamExit"
            )
        return True

    async def read_until(self, cond: Callable[[], bool]) -> None:
        while not cond() and await self.next():
            pass

    async def drain(self, within: float) -> None:
        """Read the rest, which must end within seconds; then check that the
        iterator stays ended."""

        async def loop() -> None:
            while await self.next():
                pass

        try:
            await asyncio.wait_for(loop(), within)
        except asyncio.TimeoutError:
            self.c.error(
                f"the output did not end within {within:g}s (stdout {len(self.stdout)} bytes, "
                f"stderr {len(self.stderr)} bytes so far)"
            )
            return
        try:
            item = await asyncio.wait_for(anext(self.it), KILL_PROMPT)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            self.c.error("after its end, the output iterator blocked instead of ending again")
            return
        except Exception as e:
            if self.err is None or type(e) is not type(self.err):
                self.c.error(
                    f"after its end ({self.err!r}), the output iterator raised {e!r}; want it "
                    "ended (StopAsyncIteration), or the error it ended with"
                )
            return
        self.c.error(f"after its end, the output iterator yielded {item!r}")

    def want_exit(self, code: int, why: str) -> None:
        c = self.c
        if not self.ended:
            return  # drain has said so
        if self.err is not None:
            c.error(
                f"the output ended with {self.err!r}; want a SandboxStreamExit with exit code "
                f"{code} ({why})"
            )
        elif self.exit is None:
            c.error(f"the output ended without a SandboxStreamExit; want exit code {code} ({why})")
        elif self.exit.exit_code != code:
            c.error(f"SandboxStreamExit.exit_code = {self.exit.exit_code}; want {code} ({why})")


async def start(
    c: Check,
    sess: SandboxSession,
    argv: Sequence[str],
    *,
    timeout: float = EXEC_TIMEOUT,
    **kw: Any,
) -> Reader:
    """exec_start argv; the handle is killed when the scope ends, as a
    consumer done with a handle must."""
    try:
        h = await sess.exec_start(argv, timeout_seconds=timeout, **kw)
    except Exception as e:
        c.fatal(f"exec_start({list(argv)!r}): {e!r}")
    if not isinstance(h, SandboxExecHandle):
        c.fatal(f"exec_start returned {h!r}, not a SandboxExecHandle")
    r = Reader(c, h)

    async def end() -> None:
        with contextlib.suppress(Exception):
            await h.kill()
        aclose = getattr(r.it, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()

    c.defer(end)
    return r


def merged(chunks: Sequence[SandboxStreamChunk]) -> list[tuple[str, bytes]]:
    """Consecutive chunks of one stream joined: a provider may split or join
    a stream's output into chunks as it likes, but keeps the order."""
    out: list[tuple[str, bytes]] = []
    for ch in chunks:
        if out and out[-1][0] == ch.stream:
            out[-1] = (ch.stream, out[-1][1] + ch.data)
        else:
            out.append((ch.stream, bytes(ch.data)))
    return out
