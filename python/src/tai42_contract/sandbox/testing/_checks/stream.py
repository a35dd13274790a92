"""ExecStart/... and Cancel/...: interactive execs, their stdin, output, timeout
and kill, and what a cancelled task leaves."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import cast

from ... import errors as E
from ...base import SandboxExecHandle, SandboxSession
from ...models import SandboxStreamChunk
from .._helpers import (
    EXEC_TIMEOUT,
    KILL_EXIT,
    KILL_PROMPT,
    PROMPT,
    alive,
    attempt,
    eventually,
    merged,
    must_put,
    no_secret,
    random_bytes,
    run,
    secret_env,
    secret_value,
    sh_argv,
    start,
    want_kind,
)
from .._suite import Check, clause
from .execs import want_timeout


@clause("ExecStart/Interleaved")
async def interleaved(c: Check) -> None:
    """The output interleaves stdout and stderr chunks in the order they were written, then
    ends with exactly one SandboxStreamExit, the last item."""
    _, sess = await c.fresh()
    # The command writes each line once the one before it has come through the output (it
    # waits for a line on stdin, which the check writes then): the order written is known
    # whatever the machine's load, which a pause between the writes could not promise.
    r = await start(c, sess, sh_argv("echo o1; read x; echo e1 >&2; read x; echo o2"))
    want = [("stdout", b"o1\n"), ("stderr", b"e1\n"), ("stdout", b"o2\n")]
    written = 0
    for _, data in want[:2]:
        written += len(data)
        while len(r.stdout) + len(r.stderr) < written and await r.next():
            pass
        _, err = await attempt(r.h.write_stdin(b"\n"))
        if err is not None:
            c.error(f"write_stdin after {data!r} came through: {err!r}")
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "the command exits 0")
    if (got := merged(r.chunks)) != want:
        c.error(f"the output was {got}; want {want} (stdout and stderr in the order written)")


@clause("ExecStart/ExitCode")
async def exit_code(c: Check) -> None:
    """The SandboxStreamExit carries the exec's own exit code."""
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("exit 7"))
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(7, "the command exits 7")


@clause("ExecStart/NotFound")
async def not_found(c: Check) -> None:
    """A command that cannot be found ends its output with exit code 127 and the reason on
    stderr, as exec reports it."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["tai42-no-such-command"])
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(127, "a command that cannot be found")
    if not r.stderr:
        c.error("exec_start of a missing command wrote nothing on stderr; want the reason there")


@clause("ExecStart/CwdAndEnv")
async def cwd_and_env(c: Check) -> None:
    """exec_start follows exec's cwd and env rules: cwd relative to the workspace (refused
    outside it or missing), the exec's env over the spec's."""
    _, sess = await c.fresh(env=secret_env(TAI42_A="spec-a", TAI42_B="spec-b"))
    await must_put(c, sess, "sub/x", b"")
    r = await start(
        c,
        sess,
        sh_argv('pwd; printf "%s|%s" "$TAI42_A" "$TAI42_B"'),
        cwd="sub",
        env=secret_env(TAI42_B="exec-b"),
    )
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "the command succeeds")
    want = os.path.join(sess.workspace_path, "sub") + "\nspec-a|exec-b"
    if r.stdout.decode(errors="replace") != want:
        c.error(f"exec_start with cwd sub: stdout {bytes(r.stdout)!r}; want {want!r}")
    for d in ("..", "missing"):
        h, err = await attempt(sess.exec_start(["true"], cwd=d, timeout_seconds=EXEC_TIMEOUT))
        if h is not None:
            await attempt(h.kill())
        want_kind(c, err, E.SandboxError, f"exec_start with cwd {d!r}")


async def _echo(
    c: Check, sess: SandboxSession, write: Callable[[SandboxExecHandle], Awaitable[bytes]]
) -> None:
    """Pipe what write writes through cat while a task iterates the output:
    what comes out is exactly what went in."""
    r = await start(c, sess, ["cat"], timeout=30)
    reading = c.task(r.drain(30))
    want = await write(r.h)
    _, err = await attempt(r.h.close_stdin())
    if err is not None:
        c.error(f"close_stdin(): {err!r}")
    await reading
    r.want_exit(0, "cat exits 0 at end of input")
    if bytes(r.stdout) != want:
        c.error(
            f"cat echoed {len(r.stdout)} bytes (equal: False); want the {len(want)} bytes "
            "written, intact and in order"
        )


@clause("ExecStart/StdinConcurrent")
async def stdin_concurrent(c: Check) -> None:
    """write_stdin is safe concurrently with active output iteration, and delivers each write
    intact and in order."""
    _, sess = await c.fresh()

    async def write(h: SandboxExecHandle) -> bytes:
        out = bytearray()
        for i in range(500):
            msg = f"message {i} {'x' * (i % 97)}\n".encode()
            out += msg
            _, err = await attempt(h.write_stdin(msg))
            if err is not None:
                c.error(f"write_stdin #{i}: {err!r}")
                break
        return bytes(out)

    await _echo(c, sess, write)


@clause("ExecStart/StdinLargeWrite")
async def stdin_large(c: Check) -> None:
    """One large write_stdin (8 MiB) is delivered intact while the output is read."""
    _, sess = await c.fresh()

    async def write(h: SandboxExecHandle) -> bytes:
        data = random_bytes(8 << 20)
        _, err = await attempt(h.write_stdin(data))
        if err is not None:
            c.error(f"write_stdin of 8 MiB: {err!r}")
        return data

    await _echo(c, sess, write)


@clause("ExecStart/CloseStdin")
async def close_stdin(c: Check) -> None:
    """close_stdin signals end-of-input."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["cat"])
    _, err = await attempt(r.h.close_stdin())
    if err is not None:
        c.fatal(f"close_stdin(): {err!r}")
    await r.drain(PROMPT)
    r.want_exit(0, "cat exits 0 at end of input")


@clause("ExecStart/WriteAfterExit")
async def write_after_exit(c: Check) -> None:
    """Once the exec has exited, write_stdin raises a typed SandboxError (never an arbitrary
    exception), close_stdin returns or raises one, and kill never raises."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["true"])
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "true exits 0")
    _, err = await attempt(r.h.write_stdin(b"late\n"))
    want_kind(c, err, E.SandboxError, "write_stdin after the exec exited")
    _, err = await attempt(r.h.close_stdin())
    if err is not None and not isinstance(err, E.SandboxError):
        c.error(f"close_stdin after the exec exited raised {err!r}; want None or a SandboxError")
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.error(f"kill() after the exec exited: {err!r}; once the exec has exited it never raises")


@clause("ExecStart/WriteRacingExit")
async def write_racing_exit(c: Check) -> None:
    """A write_stdin under way when the exec exits (8 MiB into head -c1, which reads one byte
    and exits) returns or raises a SandboxError, never the operating system's broken-pipe
    error."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["head", "-c1"])
    reading = c.task(r.drain(EXEC_TIMEOUT))
    _, err = await attempt(r.h.write_stdin(bytes(8 << 20)))
    if err is not None:
        want_kind(c, err, E.SandboxError, "write_stdin of 8 MiB into head -c1, which exits")
    await reading
    r.want_exit(0, "head -c1 exits 0 after one byte")
    if len(r.stdout) != 1:
        c.error(f"head -c1 wrote {len(r.stdout)} bytes; want the 1 byte it read")


@clause("ExecStart/WritersAtomic")
async def writers_atomic(c: Check) -> None:
    """write_stdin calls from two tasks at once each arrive whole: the echo of two writers of
    16 KiB blocks is a sequence of whole blocks, each writer's in order."""
    _, sess = await c.fresh()
    size, writers, blocks = 16 << 10, 2, 64

    def block(w: int, i: int) -> bytes:
        b = bytearray(bytes([ord("a") + w]) * size)
        head = f"writer {w} block {i:06d}\n".encode()
        b[: len(head)] = head
        b[-1] = ord("\n")
        return bytes(b)

    r = await start(c, sess, ["cat"], timeout=30)
    reading = c.task(r.drain(30))

    async def writer(w: int) -> None:
        for i in range(blocks):
            _, err = await attempt(r.h.write_stdin(block(w, i)))
            if err is not None:
                c.error(f"write_stdin of block {i} by writer {w}: {err!r}")
                return

    await asyncio.gather(*(writer(w) for w in range(writers)))
    _, err = await attempt(r.h.close_stdin())
    if err is not None:
        c.error(f"close_stdin(): {err!r}")
    await reading
    r.want_exit(0, "cat exits 0 at end of input")
    out = bytes(r.stdout)
    if len(out) != writers * blocks * size:
        c.fatal(f"cat echoed {len(out)} bytes; want {writers * blocks * size}")
    nxt = [0] * writers
    for off in range(0, len(out), size):
        got = out[off : off + size]
        w = got[len("writer ")] - ord("0")
        if not 0 <= w < writers or nxt[w] >= blocks or got != block(w, nxt[w]):
            c.fatal(
                f"the echo at offset {off} is {got[:40]!r}..., not a whole block of one writer "
                "in its order; a write_stdin call is never split by another's bytes"
            )
        nxt[w] += 1


@clause("ExecStart/WriteAfterClose")
async def write_after_close(c: Check) -> None:
    """Once close_stdin has returned, a write_stdin while the exec still runs is input the exec
    never gets: it raises a SandboxError, or, if accepted, the output ends with one; never
    silently dropped."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["sleep", "30"])
    _, err = await attempt(r.h.close_stdin())
    if err is not None:
        c.fatal(f"close_stdin(): {err!r}")
    _, werr = await attempt(r.h.write_stdin(b"late\n"))
    if werr is not None:
        want_kind(c, werr, E.SandboxError, "write_stdin after close_stdin")
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() of a running exec: {err!r}")
    await r.drain(KILL_PROMPT)
    if werr is None and r.err is None:
        c.error(
            f"write_stdin after close_stdin returned None and the output ended with {r.exit!r}; "
            "input the exec never gets is refused with a SandboxError, or ends the output with one"
        )


@clause("ExecStart/Timeout")
async def stream_timeout(c: Check) -> None:
    """On timeout the exec is killed promptly and the output yields what was received, then
    raises a SandboxExecTimeoutError with the exact lengths, never the content; kill then
    never raises."""
    _, sess = await c.fresh()
    secret = secret_value("stream")
    begin = time.monotonic()
    r = await start(
        c,
        sess,
        sh_argv('printf %s "$TAI42_OUT"; printf de >&2; sleep 30'),
        env=secret_env(TAI42_OUT=secret),
        timeout=1.0,
    )
    await r.drain(1 + PROMPT)
    if (took := time.monotonic() - begin) > 1 + PROMPT:
        c.error(f"the output of an exec of timeout 1 s ended after {took:.1f}s")
    if r.exit is not None:
        c.fatal(f"the output ended with {r.exit!r}; want a SandboxExecTimeoutError")
    want_timeout(c, r.err, 1.0, len(secret), 2, "the output of printf <secret>; printf de; sleep")
    no_secret(c, "the SandboxExecTimeoutError", r.err, secret)
    if bytes(r.stdout) != secret.encode() or bytes(r.stderr) != b"de":
        c.error(
            f"before the timeout the output yielded stdout {len(r.stdout)} bytes, stderr "
            f"{bytes(r.stderr)!r}; want the output received ({len(secret)} bytes, b'de')"
        )
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.error(f"kill() after the timeout killed the exec: {err!r}; it never raises then")


@clause("ExecStart/TimeoutLengths")
async def timeout_lengths(c: Check) -> None:
    """The lengths in the SandboxExecTimeoutError of an exec writing without end count every
    byte of its output: they equal the bytes the output yielded before the error, for a slow
    reader too."""
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("cat /dev/zero >&2 & exec cat /dev/zero"), timeout=1.0)
    lens = {"stdout": 0, "stderr": 0}
    while True:
        try:
            item = await anext(r.it)
        except StopAsyncIteration:
            c.fatal("the output of an exec writing without end ended with no timeout error")
        except Exception as e:
            err: Exception = e
            break
        if not isinstance(item, SandboxStreamChunk):
            c.fatal(f"the output yielded {item!r}; want chunks until a SandboxExecTimeoutError")
        lens[item.stream] += len(item.data)
        await asyncio.sleep(0.002)  # a slow reader: the output backs up
    if not want_kind(c, err, E.SandboxExecTimeoutError, "the output of an endless writer"):
        return
    te = cast(E.SandboxExecTimeoutError, err)
    if (te.stdout_len, te.stderr_len) != (lens["stdout"], lens["stderr"]):
        c.error(
            f"lengths stdout {te.stdout_len}, stderr {te.stderr_len}; the output yielded "
            f"{lens['stdout']} and {lens['stderr']} before it: the lengths count every byte"
        )


@clause("ExecStart/KillBeforeRead")
async def kill_before_read(c: Check) -> None:
    """kill before any output is read ends the output promptly with the exec's exit status."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["sleep", "30"])
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() of a running exec: {err!r}")
    await r.drain(KILL_PROMPT)
    r.want_exit(KILL_EXIT, "the exec was killed")


@clause("ExecStart/KillDuringRun")
async def kill_during_run(c: Check) -> None:
    """kill while the exec runs and output flows: what was received before is still yielded in
    order, the output ends promptly with one SandboxStreamExit, and no timeout is raised even
    when read past the deadline."""
    _, sess = await c.fresh()
    deadline_s = 2.0
    begin = time.monotonic()
    r = await start(
        c,
        sess,
        sh_argv("echo ready; i=0; while [ $i -lt 100000 ]; do echo $i; i=$((i+1)); done; sleep 30"),
        timeout=deadline_s,
    )
    await r.read_until(lambda: r.stdout.startswith(b"ready\n"))
    if not r.stdout.startswith(b"ready\n"):
        c.fatal(f"the output yielded {bytes(r.stdout[:40])!r}, {r.exit!r}, {r.err!r}; want ready")
    if time.monotonic() - begin > deadline_s - 0.5:
        c.skip("the exec took too long to print its first line to test a kill before its timeout")
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() of a running exec: {err!r}")
    await asyncio.sleep(max(0.0, begin + deadline_s + 0.5 - time.monotonic()))
    await r.drain(KILL_PROMPT)
    if isinstance(r.err, E.SandboxExecTimeoutError):
        c.error(f"the output raised {r.err!r}; once kill has returned it raises no timeout")
    r.want_exit(KILL_EXIT, "the exec was killed")
    want = bytearray(b"ready\n")
    i = 0
    while len(want) < len(r.stdout) and i < 100000:
        want += f"{i}\n".encode()
        i += 1
    if not want.startswith(r.stdout):
        c.error(
            f"the killed exec's {len(r.stdout)} bytes of stdout are not a prefix of what it "
            "wrote; the output received before a kill is yielded in order"
        )


@clause("ExecStart/KillPastDeadline")
async def kill_past_deadline(c: Check) -> None:
    """kill called after the deadline passed, before the output's end was read: once kill has
    returned the output raises no timeout; what was received before is still yielded, then
    the exit."""
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("printf early; sleep 30"), timeout=0.3)
    await asyncio.sleep(1)  # past the deadline; nothing read yet
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() past the deadline: {err!r}")
    await r.drain(KILL_PROMPT)
    if isinstance(r.err, E.SandboxExecTimeoutError):
        c.error(f"the output raised {r.err!r}; once kill has returned it raises no timeout")
    if bytes(r.stdout) != b"early":
        c.error(f"stdout {bytes(r.stdout)!r}; want b'early', received before the kill")
    if r.exit is None:
        c.error(f"the output ended without a SandboxStreamExit ({r.err!r}); a killed exec has one")


@clause("ExecStart/KillAfterExit")
async def kill_after_exit(c: Check) -> None:
    """kill after the exec exited (its exit item not yet read) never raises, and the exit
    status stays the exec's own; kill after the end again never raises."""
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("exit 3"))
    await asyncio.sleep(0.3)  # the exec has exited; its exit item is unread
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.error(f"kill() after the exec exited: {err!r}; once the exec has exited it never raises")
    await r.drain(KILL_PROMPT)
    r.want_exit(3, "the exec's own exit status, not the kill's")
    for _ in range(2):
        _, err = await attempt(r.h.kill())
        if err is not None:
            c.error(f"kill() after the output ended: {err!r}; kill is idempotent")


@clause("ExecStart/KillTwice")
async def kill_twice(c: Check) -> None:
    """kill may be called more than once."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["sleep", "30"])
    for i in (1, 2):
        _, err = await attempt(r.h.kill())
        if err is not None:
            c.error(f"kill() #{i}: {err!r}; kill may be called more than once")
    await r.drain(KILL_PROMPT)
    r.want_exit(KILL_EXIT, "the exec was killed")


@clause("ExecStart/KillConcurrent")
async def kill_concurrent(c: Check) -> None:
    """kill is safe from many tasks at once, during the run and after the exit."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["sleep", "30"])

    async def kill_all(when: str) -> None:
        for _, err in await asyncio.gather(*(attempt(r.h.kill()) for _ in range(8))):
            if err is not None:
                c.error(f"concurrent kill() {when}: {err!r}")

    await kill_all("while the exec runs")
    await r.drain(KILL_PROMPT)
    r.want_exit(KILL_EXIT, "the exec was killed")
    await kill_all("after the exec exited")


@clause("ExecStart/KillKeepsReceivedOutput")
async def kill_keeps_output(c: Check) -> None:
    """The output the provider received before the kill, read or not, is still yielded."""
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("printf hello; sleep 30"))
    await asyncio.sleep(0.3)  # any provider has taken the printf in; nothing is read
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() of a running exec: {err!r}")
    await r.drain(KILL_PROMPT)
    if bytes(r.stdout) != b"hello":
        c.error(f"after kill the output yielded stdout {bytes(r.stdout)!r}; want b'hello'")
    r.want_exit(KILL_EXIT, "the exec was killed")


@clause("ExecStart/KillStopsLeftovers")
async def kill_stops_leftovers(c: Check) -> None:
    """Documented behaviour (Options.kill_stops_leftovers): kill after the command exited also
    ends the processes it left running (skipped when the provider ended them at the
    command's exit already)."""
    if not c.opts.kill_stops_leftovers:
        c.skip("Options.kill_stops_leftovers is false: the provider does not document it")
    _, sess = await c.fresh()
    r = await start(c, sess, sh_argv("sleep 30 >/dev/null 2>&1 </dev/null & echo $!"))
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "sh exits 0 after starting the child")
    pid = r.stdout.decode(errors="replace").strip()
    if not pid.isdigit():
        c.fatal(f"stdout {bytes(r.stdout)!r}; want the pid of the child left running")
    if not await alive(c, sess, pid):
        c.skip(
            f"the provider ended the child {pid} at the command's exit already: nothing is "
            "left for kill to stop"
        )
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() after the exec exited: {err!r}")

    async def gone() -> bool:
        return not await alive(c, sess, pid)

    if not await eventually(KILL_PROMPT, gone):
        c.error(f"the process {pid} the command left running still runs {KILL_PROMPT}s after kill")


# Cancel/...


@clause("Cancel/Exec")
async def cancel_exec(c: Check) -> None:
    """A task awaiting exec that is cancelled ends promptly with CancelledError; the command is
    killed and the session stays usable."""
    _, sess = await c.fresh()
    task = c.task(sess.exec(sh_argv("echo $$ > pid; exec sleep 30"), timeout_seconds=EXEC_TIMEOUT))
    await asyncio.sleep(0.5)
    task.cancel()
    begin = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=PROMPT)
    if not done:
        c.fatal(f"a cancelled exec(sleep 30) had not ended {PROMPT}s after the cancel")
    if not task.cancelled():
        c.error(
            f"a cancelled exec ended with {task.exception() or task.result()!r}; want the "
            "CancelledError"
        )
    if (took := time.monotonic() - begin) > PROMPT:
        c.error(f"a cancelled exec took {took:.1f}s to end")
    data, _ = await attempt(sess.get_file("pid"))
    pid = (data or b"").decode(errors="replace").strip()
    if pid.isdigit():

        async def gone() -> bool:
            return not await alive(c, sess, pid)

        if not await eventually(PROMPT, gone):
            c.error(f"the command of a cancelled exec (pid {pid}) still runs; a cancel kills it")
    res = await run(c, sess, ["echo", "ok"])
    if res.stdout != "ok\n":
        c.error(f"exec(echo ok) after a cancelled exec = {res!r}; the session stays usable")


@clause("Cancel/WriteStdin")
async def cancel_write_stdin(c: Check) -> None:
    """A task in write_stdin to an exec that reads nothing, cancelled, ends promptly (returned
    or cancelled); kill then ends the exec with its exit status."""
    _, sess = await c.fresh()
    r = await start(c, sess, ["sleep", "30"])
    task = c.task(r.h.write_stdin(bytes(64 << 20)))
    await asyncio.sleep(0.5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=PROMPT)
    if not done:
        c.fatal(f"a cancelled write_stdin had not ended {PROMPT}s after the cancel")
    if not task.cancelled() and task.exception() is not None:
        want_kind(c, task.exception(), E.SandboxError, "a cancelled write_stdin")
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.fatal(f"kill() after a cancelled write_stdin: {err!r}")
    await r.drain(KILL_PROMPT)
    r.want_exit(KILL_EXIT, "the exec was killed")
