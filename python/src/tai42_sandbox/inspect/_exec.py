"""Running one Inspect exec, and the probes that explain a failure the
daemon reports without a kind of its own.

An Inspect exec is a streamed exec (``exec_start``): stdin goes in chunks
however large it is (a one-shot exec carries it in a JSON body the daemon
caps), and output is counted as it arrives, so Inspect's output limit stops
the exec at the limit instead of after the daemon buffered all of it. Only
a command too long for the stream's start frame (1 MiB of argv and env)
runs as a one-shot exec, whose JSON body holds up to 64 MiB: the daemon then
holds its output up to its own limit (``--max-output-bytes``, 64 MiB per
stream by default), and Inspect's is applied to the result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from pydantic import SecretStr

from tai42_contract.sandbox.errors import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxOutputLimitError,
)
from tai42_contract.sandbox.models import SandboxStreamChunk
from tai42_sandbox import Tai42ExecHandle, Tai42Session

# How much stdin goes in one write: big enough that 50 MiB is a few dozen
# round trips, well under the daemon's 2 MiB of unacknowledged stdin.
STDIN_CHUNK = 1 << 20

# The most a start frame of the exec stream may hold (the daemon reads
# frames of up to 1 MiB + 9 bytes), less room for what the client adds.
START_FRAME_BUDGET = (1 << 20) - 4096

# Bounds on the calls made after an exec: the kill of a handle (even when
# its caller was cancelled), and a probe.
KILL_TIMEOUT = 30.0
PROBE_TIMEOUT = 30.0

# The PATH of the file probe, which runs as the session's default user
# (root) before anything of the caller's: no tool of it comes from the
# image's own, possibly user-writable, PATH. Every probe starts /bin/sh by
# absolute path and uses only its builtins.
PINNED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class StreamedResult:
    """An exec's exit code and its output, whole (within the limit)."""

    exit_code: int
    stdout: bytes
    stderr: bytes


class OutputOverLimit(Exception):
    """A stream passed the limit; the exec was killed. Carries what was
    received, each stream cut at the limit."""

    def __init__(self, stdout: bytes, stderr: bytes) -> None:
        super().__init__("output over the limit")
        self.stdout = stdout
        self.stderr = stderr


class TimedOut(Exception):
    """The exec passed its timeout and the daemon killed it. Carries the
    output received before, each stream cut at the limit."""

    def __init__(self, error: SandboxExecTimeoutError, stdout: bytes, stderr: bytes) -> None:
        super().__init__(str(error))
        self.error = error
        self.stdout = stdout
        self.stderr = stderr


@dataclass
class _Collected:
    limit: int
    streams: dict[str, bytearray] = field(
        default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()}
    )

    def add(self, chunk: SandboxStreamChunk) -> None:
        buf = self.streams[chunk.stream]
        buf += chunk.data
        if len(buf) > self.limit:
            raise OutputOverLimit(self.bytes("stdout"), self.bytes("stderr"))

    def bytes(self, stream: str) -> bytes:
        return bytes(self.streams[stream][: self.limit])


async def run_streamed(
    session: Tai42Session,
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | None,
    timeout_seconds: float,
    limit: int,
) -> StreamedResult:
    """Run argv to completion, stdin fed and output collected at once.

    Raises :class:`OutputOverLimit` when a stream passes ``limit`` bytes,
    :class:`TimedOut` past the timeout, and the client's other errors as
    they come (SandboxUserNotFoundError, ...). A streamed exec's handle is
    killed on every way out, cancellation included: a handle keeps daemon
    resources until then.
    """
    secret_env = {k: SecretStr(v) for k, v in env.items()} if env else None
    if _start_frame_size(argv, cwd, env, user) > START_FRAME_BUDGET:
        return await _run_one_shot(
            session,
            argv,
            stdin=stdin,
            cwd=cwd,
            env=secret_env,
            user=user,
            timeout_seconds=timeout_seconds,
            limit=limit,
        )
    handle = await session.exec_start(
        list(argv), cwd=cwd, env=secret_env, timeout_seconds=timeout_seconds, user=user
    )
    collected = _Collected(limit)
    failure: Exception | None = None
    exit_code = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, handle, stdin)
            # Caught here and raised past the task group, which would wrap it
            # in an ExceptionGroup; cancellation goes through as it is.
            try:
                exit_code = await _collect(handle, collected)
            except Exception as e:
                failure = e
            # stdin the exec never read stops with it
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
            await handle.kill()
    if isinstance(failure, SandboxExecTimeoutError):
        raise TimedOut(failure, collected.bytes("stdout"), collected.bytes("stderr")) from failure
    if failure is not None:
        raise failure
    return StreamedResult(exit_code, collected.bytes("stdout"), collected.bytes("stderr"))


def _start_frame_size(
    argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None, user: str | None
) -> int:
    frame = {"argv": list(argv), "cwd": cwd or "", "env": dict(env or {}), "user": user or ""}
    return len(json.dumps(frame, ensure_ascii=False).encode("utf-8", "surrogateescape"))


async def _run_one_shot(
    session: Tai42Session,
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    cwd: str | None,
    env: dict[str, SecretStr] | None,
    user: str | None,
    timeout_seconds: float,
    limit: int,
) -> StreamedResult:
    try:
        r = await session.exec(
            list(argv), cwd=cwd, env=env, stdin=stdin, timeout_seconds=timeout_seconds, user=user
        )
    except SandboxExecTimeoutError as e:
        raise TimedOut(e, b"", b"") from e
    except SandboxOutputLimitError:
        raise OutputOverLimit(b"", b"") from None
    # The result keeps undecodable bytes as surrogate escapes: the bytes back.
    out = r.stdout.encode("utf-8", "surrogateescape")
    err = r.stderr.encode("utf-8", "surrogateescape")
    if len(out) > limit or len(err) > limit:
        raise OutputOverLimit(out[:limit], err[:limit])
    return StreamedResult(r.exit_code, out, err)


async def _feed(handle: Tai42ExecHandle, data: bytes | None) -> None:
    """Write data to the exec's stdin, then end it. A failed write ends the
    feeding quietly: an exec may exit without reading its input (as with a
    broken pipe), and the output stream reports any failure of the exec."""
    try:
        view = memoryview(data or b"")
        for start in range(0, len(view), STDIN_CHUNK):
            await handle.write_stdin(bytes(view[start : start + STDIN_CHUNK]))
        await handle.close_stdin()
    except SandboxError:
        pass


async def _collect(handle: Tai42ExecHandle, collected: _Collected) -> int:
    async for item in handle.output:
        if isinstance(item, SandboxStreamChunk):
            collected.add(item)
        else:
            return item.exit_code
    raise SandboxError("the exec's output ended without its exit status", op="exec")


async def probe(
    session: Tai42Session,
    script: str,
    args: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> str | None:
    """What a small /bin/sh script prints (stripped), run in the session
    with args as "$1"..., or None when it could not run or failed: a probe
    only ever adds an explanation, so its own failure explains nothing.
    It runs within PROBE_TIMEOUT."""
    with anyio.move_on_after(PROBE_TIMEOUT):
        try:
            r = await run_streamed(
                session,
                ["/bin/sh", "-c", script, "tai42-probe", *args],
                stdin=None,
                cwd=cwd,
                env=env,
                user=user,
                timeout_seconds=PROBE_TIMEOUT,
                limit=4096,
            )
        except (SandboxError, OutputOverLimit, TimedOut):
            return None
        if r.exit_code != 0:
            return None
        return r.stdout.decode("utf-8", "replace").strip()
    return None


# Prints "directory" when "$1" is a directory, "denied" when the access "$2"
# (read or write) of it is refused to this user: for a file that exists,
# its own mode; for one to be created, that of its nearest existing
# ancestor. `test -r/-w` ask the kernel (access(2)), so a read-only mount
# counts, and root is refused only what root is.
FILE_PROBE = """
p=$1
if [ -d "$p" ]; then echo directory; exit 0; fi
if [ -e "$p" ] || [ -L "$p" ]; then
  case $2 in
    read) [ -r "$p" ] || echo denied ;;
    write) [ -w "$p" ] || echo denied ;;
  esac
  exit 0
fi
if [ "$2" = write ]; then
  d=$p
  while :; do
    case $d in
      */*) d=${d%/*}; [ -n "$d" ] || d=/ ;;
      *) d=. ;;
    esac
    [ -e "$d" ] && break
  done
  if [ -d "$d" ] && [ ! -w "$d" ]; then echo denied; fi
fi
"""

# Prints "denied" when the command "$1" names a file this user may not
# execute (a directory, or a file without execute permission for it):
# resolved like the exec resolved it, by PATH when it has no slash.
EXEC_PROBE = """
p=$1
case $p in
  */*) ;;
  *) p=$(command -v -- "$p") || exit 0 ;;
esac
if [ -d "$p" ] || { [ -e "$p" ] && [ ! -x "$p" ]; }; then echo denied; fi
"""
