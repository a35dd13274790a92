"""Running one Inspect exec over the daemon's streamed exec, and the
probes that explain a failure the daemon reports without a kind of its own.

Every Inspect exec is a streamed exec (``exec_start``): stdin goes in
chunks however large it is (a one-shot exec carries it in a JSON body the
daemon caps), and output is counted as it arrives, so Inspect's output
limit stops the exec at the limit instead of after buffering all of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from pydantic import SecretStr

from tai42_contract.sandbox.errors import SandboxError, SandboxExecTimeoutError
from tai42_contract.sandbox.models import SandboxStreamChunk
from tai42_sandbox import Tai42ExecHandle, Tai42Session

# How much stdin goes in one write: big enough that 50 MiB is a few dozen
# round trips, well under the daemon's 2 MiB of unacknowledged stdin.
STDIN_CHUNK = 1 << 20

# Bounds on the calls made after an exec, even when its caller was
# cancelled: the kill of a handle, and a probe.
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


class OutputOverLimit(Exception):  # noqa: N818 (an outcome, mapped by the caller)
    """A stream passed the limit; the exec was killed. Carries what was
    received, each stream cut at the limit."""

    def __init__(self, stdout: bytes, stderr: bytes) -> None:
        super().__init__("output over the limit")
        self.stdout = stdout
        self.stderr = stderr


class TimedOut(Exception):  # noqa: N818 (an outcome, mapped by the caller)
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
    they come (SandboxUserNotFoundError, ...). The handle is killed on every way out,
    cancellation included: a handle keeps daemon resources until then.
    """
    secret_env = {k: SecretStr(v) for k, v in env.items()} if env else None
    handle = await session.exec_start(
        list(argv), cwd=cwd, env=secret_env, timeout_seconds=timeout_seconds, user=user
    )
    collected = _Collected(limit)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, handle, stdin)
            try:
                exit_code = await _collect(handle, collected)
            except SandboxExecTimeoutError as e:
                raise TimedOut(e, collected.bytes("stdout"), collected.bytes("stderr")) from e
            finally:
                # stdin the exec never read stops with it
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_TIMEOUT):
            await handle.kill()
    return StreamedResult(exit_code, collected.bytes("stdout"), collected.bytes("stderr"))


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
    It runs shielded from cancellation, within PROBE_TIMEOUT."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(PROBE_TIMEOUT):
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

