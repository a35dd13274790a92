"""Exec/...: exec to completion, its arguments, environment, results and
errors."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Sequence
from typing import Any, cast

from ... import errors as E
from .._helpers import (
    EXEC_TIMEOUT,
    PROMPT,
    alive,
    attempt,
    attempt_call,
    eventually,
    exists,
    must_put,
    must_sh,
    no_secret,
    random_text,
    run,
    secret_env,
    secret_value,
    sh_argv,
    start,
    want_kind,
)
from .._suite import MARKER_VAR, PERMISSIVE, Check, Config, clause


@clause("Exec/ExitCode")
async def exit_code(c: Check) -> None:
    """A non-zero exit is a result, not an error; stdout and stderr are kept apart."""
    _, sess = await c.fresh()
    res = await run(c, sess, sh_argv("printf out; printf err >&2; exit 3"))
    if (res.exit_code, res.stdout, res.stderr) != (3, "out", "err"):
        c.error(
            f"exec(sh -c 'printf out; printf err >&2; exit 3') = {res!r}; want exit_code 3, "
            "stdout 'out', stderr 'err' (a non-zero exit is a result, not an error)"
        )
    res = await run(c, sess, ["true"])
    if (res.exit_code, res.stdout, res.stderr) != (0, "", ""):
        c.error(f"exec(true) = {res!r}; want exit code 0 and no output")


@clause("Exec/Argv")
async def argv(c: Check) -> None:
    """argv reaches the command as given, one argument each, byte for byte: no shell splits,
    expands or quotes it (any Sequence[str] will do)."""
    _, sess = await c.fresh()
    args = ("a b", "", "'q'", '"dq"', "$HOME", "*", "x\ny", "back\\slash", "é漢😀", "-n")
    script = 'for a; do printf "[%s]" "$a"; done'
    res = await run(c, sess, ("sh", "-c", script, "sh", *args))
    want = "".join(f"[{a}]" for a in args)
    if (res.exit_code, res.stdout) != (0, want):
        c.error(f"the command saw its arguments as {res.stdout!r}; want {want!r}")


@clause("Exec/Signal")
async def signal(c: Check) -> None:
    """A command killed by a signal reports 128+signal."""
    _, sess = await c.fresh()
    res = await run(c, sess, sh_argv("kill -9 $$"))
    if res.exit_code != 137:
        c.error(f"exec(sh -c 'kill -9 $$').exit_code = {res.exit_code}; want 137 (128+SIGKILL)")


@clause("Exec/NotFound")
async def not_found(c: Check) -> None:
    """A command that cannot be found is exit code 127 with the reason on stderr, not an
    error."""
    _, sess = await c.fresh()
    for name in ("tai42-no-such-command", "/tai42-no-such-dir/tai42-no-such-command"):
        res, err = await attempt(sess.exec([name], timeout_seconds=EXEC_TIMEOUT))
        if err is not None or res is None:
            c.error(f"exec({name!r}): {err!r}; a missing command is a result (127), not an error")
        elif res.exit_code != 127:
            c.error(f"exec({name!r}).exit_code = {res.exit_code}; want 127")
        elif not res.stderr:
            c.error(f"exec({name!r}) has an empty stderr; want the reason there")


@clause("Exec/NotExecutable")
async def not_executable(c: Check) -> None:
    """A command that exists but cannot be executed is exit code 126, the reason on stderr."""
    _, sess = await c.fresh()
    await must_sh(c, sess, "printf '#!/bin/sh\\necho ran\\n' > noexec && chmod 644 noexec")
    p = os.path.join(sess.workspace_path, "noexec")
    res, err = await attempt(sess.exec([p], timeout_seconds=EXEC_TIMEOUT))
    if err is not None or res is None:
        c.error(f"exec({p!r}) of a non-executable file: {err!r}; want a result, exit code 126")
    elif res.exit_code != 126:
        c.error(f"exec({p!r}) of a non-executable file: exit code {res.exit_code}; want 126")
    elif not res.stderr:
        c.error(f"exec({p!r}) of a non-executable file has an empty stderr; want the reason")


def _bad_arg(c: Check, err: BaseException | None, what: str) -> None:
    if want_kind(c, err, E.SandboxError, what) and isinstance(err, E.SandboxExecTimeoutError):
        c.error(f"{what}: got a SandboxExecTimeoutError; want the argument refused before it runs")


@clause("Exec/BadTimeout")
async def bad_timeout(c: Check) -> None:
    """A timeout_seconds of 0, less, or NaN is refused with a SandboxError (no timeout error),
    never taken as "no timeout", by exec and exec_start alike; nothing runs."""
    _, sess = await c.fresh()
    for i, t in enumerate((0.0, -1.0, math.nan)):
        argv = sh_argv(f": > ran{i}")
        _, err = await attempt(sess.exec(argv, timeout_seconds=t))
        _bad_arg(c, err, f"exec with timeout_seconds {t}")
        h, err = await attempt(sess.exec_start(argv, timeout_seconds=t))
        _bad_arg(c, err, f"exec_start with timeout_seconds {t}")
        if h is not None:
            await attempt(h.kill())
        await asyncio.sleep(0.1)
        if await exists(c, sess, f"ran{i}"):
            c.error(f"a command with timeout_seconds {t} ran; a refused exec runs nothing")


@clause("Exec/TimeoutRequired")
async def timeout_required(c: Check) -> None:
    """timeout_seconds is required: exec and exec_start called without it raise (TypeError,
    or a SandboxError) and run nothing."""
    _, sess = await c.fresh()
    loose = cast(Any, sess)
    for call in ("exec", "exec_start"):
        res, err = await attempt_call(getattr(loose, call), sh_argv(f": > ran-{call}"))
        if err is None:
            c.error(f"{call}() without timeout_seconds returned {res!r}; want it refused")
            if res is not None and hasattr(res, "kill"):
                await attempt(res.kill())
        elif not isinstance(err, (TypeError, E.SandboxError)):
            c.error(f"{call}() without timeout_seconds raised {err!r}; want a TypeError")
    await asyncio.sleep(0.1)
    for call in ("exec", "exec_start"):
        if await exists(c, sess, f"ran-{call}"):
            c.error(f"{call}() without timeout_seconds ran the command")


@clause("Exec/EmptyArgv")
async def empty_argv(c: Check) -> None:
    """An empty argv is refused with a SandboxError by exec and exec_start."""
    _, sess = await c.fresh()
    empties: tuple[Sequence[str], ...] = ([], ())
    for argv in empties:
        _, err = await attempt(sess.exec(argv, timeout_seconds=EXEC_TIMEOUT))
        _bad_arg(c, err, f"exec({argv!r})")
        h, err = await attempt(sess.exec_start(argv, timeout_seconds=EXEC_TIMEOUT))
        _bad_arg(c, err, f"exec_start({argv!r})")
        if h is not None:
            await attempt(h.kill())


def want_timeout(
    c: Check, err: BaseException | None, timeout: float, out: int, errlen: int, what: str
) -> None:
    """err is a SandboxExecTimeoutError with these attributes."""
    if not want_kind(c, err, E.SandboxExecTimeoutError, what):
        return
    te = cast(E.SandboxExecTimeoutError, err)
    if te.timeout_seconds != timeout:
        c.error(f"{what}: timeout_seconds = {te.timeout_seconds!r}; want {timeout}")
    if (te.stdout_len, te.stderr_len) != (out, errlen):
        c.error(
            f"{what}: lengths stdout {te.stdout_len!r}, stderr {te.stderr_len!r}; want {out} "
            f"and {errlen}, every byte the exec produced"
        )


@clause("Exec/Timeout")
async def timeout(c: Check) -> None:
    """On timeout the exec is killed promptly and a SandboxExecTimeoutError carries the
    timeout and the exact lengths of the output produced, never its content."""
    _, sess = await c.fresh()
    secret = secret_value("timeout")
    begin = time.monotonic()
    _, err = await attempt(
        sess.exec(
            sh_argv('printf %s "$TAI42_OUT"; printf de >&2; sleep 30'),
            env=secret_env(TAI42_OUT=secret),
            timeout_seconds=1.0,
        )
    )
    if (took := time.monotonic() - begin) > 1 + PROMPT:
        c.error(f"exec with timeout_seconds 1 returned after {took:.1f}s; want it killed promptly")
    want_timeout(c, err, 1.0, len(secret), 2, "exec(printf <secret>; printf de >&2; sleep 30)")
    no_secret(c, "the SandboxExecTimeoutError", err, secret)


def _note(err: BaseException) -> str:
    return str(getattr(err, "note", "") or "") + "".join(getattr(err, "__notes__", []))


@clause("Exec/TimeoutHeldOutput")
async def timeout_held_output(c: Check) -> None:
    """A timeout whose output a process outside the exec's process group (setsid) still holds
    after the kill says so in a note on the error, and counts the output received up to the
    stop; a provider that ends that process too owes no note."""
    _, sess = await c.fresh()
    if (await run(c, sess, sh_argv("command -v setsid"))).exit_code != 0:
        c.skip("the session has no setsid to start a process outside the exec's process group")
    _, err = await attempt(
        sess.exec(
            sh_argv("setsid sleep 30 & echo $! > held.pid; printf x; sleep 30"),
            timeout_seconds=1.0,
        )
    )
    data, _ = await attempt(sess.get_file("held.pid"))
    pid = (data or b"").decode(errors="replace").strip()
    if not pid.isdigit():
        c.fatal(f"held.pid holds {pid!r}; want the pid of the process started with setsid")

    async def kill_held() -> None:
        await attempt(sess.exec(["kill", "-9", pid], timeout_seconds=EXEC_TIMEOUT))

    held = await alive(c, sess, pid)
    c.defer(kill_held)
    what = "exec(setsid sleep 30 & printf x; sleep 30) past its timeout"
    if not want_kind(c, err, E.SandboxExecTimeoutError, what):
        return
    te = cast(E.SandboxExecTimeoutError, err)
    if (te.stdout_len, te.stderr_len) != (1, 0):
        c.error(f"{what}: lengths {te.stdout_len}, {te.stderr_len}; want 1 and 0, the output")
    if held and not _note(te):
        c.error(
            f"{what}: the process {pid} started with setsid still runs, holding the output, and "
            f"the error {str(te)!r} carries no note saying so"
        )


@clause("Exec/Env")
async def env(c: Check) -> None:
    """The exec's env overlays the session's spec.env (the exec's value wins on a collision),
    values arrive byte-exact, an exec's env is its own, and nothing of the host's
    environment leaks in."""
    _, sess = await c.fresh(env=secret_env(TAI42_A="spec-a", TAI42_B="spec-b"))
    tricky = "x y\n'\"$HOME\\ *é"
    res = await run(
        c,
        sess,
        sh_argv('printf "%s|%s|%s|%s" "$TAI42_A" "$TAI42_B" "$TAI42_C" "$TAI42_D"'),
        env=secret_env(TAI42_B="exec-b", TAI42_C="exec-c", TAI42_D=tricky),
    )
    if (want := "spec-a|exec-b|exec-c|" + tricky) != res.stdout:
        c.error(f"A|B|C|D = {res.stdout!r}; want {want!r} (spec env overlaid by exec env)")
    res = await run(c, sess, sh_argv('printf "%s|%s|%s" "$TAI42_A" "$TAI42_B" "$TAI42_C"'))
    if res.stdout != "spec-a|spec-b|":
        c.error(f"A|B|C in a later exec without env = {res.stdout!r}; want 'spec-a|spec-b|'")
    res = await run(c, sess, ["env"])
    if any(line.startswith(MARKER_VAR + "=") for line in res.stdout.splitlines()):
        c.error(
            f"the exec's environment holds {MARKER_VAR}, set in the suite's process only; an "
            "exec's environment never inherits the host's"
        )


@clause("Exec/SecretsNotInErrors")
async def secrets_not_in_errors(c: Check) -> None:
    """Env values never appear in an error (its text, repr, args or the errors it chains to),
    whatever fails: a refused or missing cwd, a missing timeout, a timeout, a rejected spec;
    nor in info() or list_sessions()."""
    spec_secret, exec_secret = secret_value("spec"), secret_value("exec")
    both = (spec_secret, exec_secret)
    sb, sess = await c.fresh(env=secret_env(TAI42_S=spec_secret))
    env = secret_env(TAI42_E=exec_secret)
    _, err = await attempt(sess.exec(["true"], env=env, cwd="../..", timeout_seconds=EXEC_TIMEOUT))
    want_kind(c, err, E.SandboxError, "exec with a cwd climbing out")
    no_secret(c, "the error of an exec with a refused cwd", err, *both)
    await must_put(c, sess, "file", b"x")
    for cwd in ("no-such-dir", "file"):
        _, err = await attempt(sess.exec(["true"], env=env, cwd=cwd, timeout_seconds=EXEC_TIMEOUT))
        want_kind(c, err, E.SandboxError, f"exec with the cwd {cwd}")
        no_secret(c, f"the error of an exec with the cwd {cwd}", err, *both)
        h, err = await attempt(
            sess.exec_start(["true"], env=env, cwd=cwd, timeout_seconds=EXEC_TIMEOUT)
        )
        if h is not None:
            await attempt(h.kill())
        want_kind(c, err, E.SandboxError, f"exec_start with the cwd {cwd}")
        no_secret(c, f"the error of an exec_start with the cwd {cwd}", err, *both)
    _, err = await attempt_call(cast(Any, sess).exec, ["true"], env=env)
    no_secret(c, "the error of an exec without a timeout", err, *both)
    _, err = await attempt(
        sess.exec(
            sh_argv('printf %s "$TAI42_S$TAI42_E" >&2; sleep 30'), env=env, timeout_seconds=0.5
        )
    )
    want_kind(c, err, E.SandboxExecTimeoutError, "exec past its timeout")
    no_secret(c, "the SandboxExecTimeoutError", err, *both)
    bad = secret_value("badkey")
    made, err = await attempt(
        sb.create_session(c.spec().model_copy(update={"env": secret_env(**{"TAI42=BAD": bad})}))
    )
    if made is not None:
        c.destroy_at_end(sb, made.id)
    want_kind(c, err, E.SandboxSpecRejectedError, "create_session with an env key holding '='")
    no_secret(c, "the rejection of a bad env key", err, bad)
    info, err = await attempt(sess.info())
    no_secret(c, "info()", info if err is None else err, spec_secret)
    listed, err = await attempt(sb.list_sessions())
    no_secret(c, "list_sessions()", listed if err is None else err, spec_secret)


@clause("Exec/SecretsNotInRepr")
async def secrets_not_in_repr(c: Check) -> None:
    """Env values never show in what a Python caller prints of the provider's objects: the
    repr and str of the session, of an exec handle, of results, stream items and info."""
    spec_secret, exec_secret = secret_value("spec"), secret_value("exec")
    both = (spec_secret, exec_secret)
    sb, sess = await c.fresh(env=secret_env(TAI42_S=spec_secret))
    env = secret_env(TAI42_E=exec_secret)
    no_secret(c, "the session", sess, *both)
    got, _ = await attempt(sb.get_session(sess.id))
    no_secret(c, "the session get_session returns", got, *both)
    res = await run(c, sess, ["true"], env=env)
    no_secret(c, "an ExecResult", res, *both)
    r = await start(c, sess, ["true"], env=env)
    no_secret(c, "an exec handle", r.h, *both)
    no_secret(c, "an exec handle's output", r.it, *both)
    await r.drain(EXEC_TIMEOUT)
    no_secret(c, "the output items", [*r.chunks, r.exit], *both)
    no_secret(c, "an exec handle after its end", r.h, *both)
    no_secret(c, "the sandbox", sb, *both)


@clause("Exec/SecretsNotInLogs")
async def secrets_not_in_logs(c: Check) -> None:
    """Env values never reach a log line, at any level: through create, execs that print them,
    fail, time out or are killed, a rejected spec, a destroy and the reaper, no line the
    provider logs (to Config.log) holds a secret."""
    if not c.opts.logs:
        c.skip("Options.logs is false: the factory does not route the provider's logs")
    spec_secret, exec_secret, bad = secret_value("spec"), secret_value("exec"), secret_value("bad")
    values = (spec_secret, exec_secret, bad)
    sb = await c.sandbox(Config(policy=PERMISSIVE, reap_interval_seconds=0.1))
    senv = secret_env(TAI42_S=spec_secret)
    sess = await c.session(sb, env=senv)
    expiring = await c.session(sb, env=senv, ttl_seconds=1)
    info, err = await attempt(expiring.info())
    if info is None:
        c.fatal(f"info() of a session just made: {err!r}")
    env = secret_env(TAI42_E=exec_secret)
    both = 'printf \'%s %s\' "$TAI42_S" "$TAI42_E"; printf \'%s %s\' "$TAI42_S" "$TAI42_E" >&2'
    await run(c, sess, sh_argv(both + "; exit 3"), env=env)
    await attempt(sess.exec(["true"], env=env, cwd="no-such-dir", timeout_seconds=EXEC_TIMEOUT))
    await attempt(sess.exec(["tai42-no-such-command"], env=env, timeout_seconds=EXEC_TIMEOUT))
    await attempt(sess.exec(sh_argv(both + "; sleep 30"), env=env, timeout_seconds=0.3))
    killed = await start(c, sess, sh_argv(both + "; sleep 30"), env=env)
    await killed.next()
    _, err = await attempt(killed.h.kill())
    if err is not None:
        c.error(f"kill(): {err!r}")
    await killed.drain(PROMPT)
    timed_out = await start(c, sess, sh_argv(both + "; sleep 30"), env=env, timeout=0.3)
    await timed_out.drain(PROMPT)
    made, _ = await attempt(
        sb.create_session(c.spec().model_copy(update={"env": secret_env(**{"TAI42=BAD": bad})}))
    )
    if made is not None:
        c.destroy_at_end(sb, made.id)
    await asyncio.sleep(max(0.0, info.expires_at.timestamp() - time.time()) + 0.1)

    async def reaped() -> bool:
        _, gone = await attempt(expiring.info())
        return isinstance(gone, E.SandboxSessionNotFoundError)

    if not await eventually(5, reaped):
        c.error("the session of ttl_seconds 1 was not gone within 5 s of its expiry")
    await asyncio.sleep(0.5)  # a few sweeps of the reaper
    _, err = await attempt(sb.destroy_session(sess.id))
    if err is not None:
        c.error(f"destroy_session: {err!r}")
    if not c.logs:
        c.fatal(
            "nothing was logged to Config.log by a create, execs, a reap and a destroy; "
            "Options.logs says the factory routes the provider's logs there"
        )
    for line in c.logs:
        for v in values:
            if v in line:
                c.error(f"a log line shows an env value: {line[:300]!r}")


@clause("Exec/Cwd")
async def cwd(c: Check) -> None:
    """cwd is workspace-relative (unset is workspace_path itself; an absolute path inside it is
    accepted), must stay inside the workspace, and must exist: a refused cwd raises a
    SandboxError and runs nothing."""
    _, sess = await c.fresh()
    ws = sess.workspace_path
    if not os.path.isabs(ws):
        c.fatal(f"workspace_path = {ws!r}; want an absolute path")
    await must_put(c, sess, "sub/x", b"x")
    await must_sh(c, sess, "ln -s / out")
    sub = os.path.join(ws, "sub")
    cases: list[tuple[str | None, str]] = [
        (None, ws),
        ("", ws),
        ("sub", sub),
        ("./sub/", sub),
        ("sub/../sub", sub),
        (sub, sub),
        (ws, ws),
    ]
    for d, want in cases:
        res, err = await attempt(sess.exec(["pwd"], cwd=d, timeout_seconds=EXEC_TIMEOUT))
        if err is not None or res is None:
            c.error(f"exec(pwd) with cwd {d!r}: {err!r}")
        elif (got := res.stdout.rstrip("\n")) != want:
            c.error(f"exec(pwd) with cwd {d!r} ran in {got!r}; want {want!r}")
    refused = [
        "..",
        "sub/../..",
        "../" + os.path.basename(ws) + "x",
        "out",
        "out/tmp",
        "missing",
        "sub/missing",
    ]
    if c.opts.absolute_outside_workspace_refused:
        refused += ["/", os.path.dirname(ws)]
    for i, d in enumerate(refused):
        marker = os.path.join(ws, f"ran{i}")
        _, err = await attempt(
            sess.exec(sh_argv('printf ran > "$1"', marker), cwd=d, timeout_seconds=EXEC_TIMEOUT)
        )
        want_kind(
            c, err, E.SandboxError, f"exec with cwd {d!r} (outside the workspace, or missing)"
        )
        if await exists(c, sess, marker):
            c.error(f"exec with the refused cwd {d!r} ran the command")


@clause("Exec/Stdin")
async def stdin(c: Check) -> None:
    """exec delivers its stdin byte-exact (about 1 MiB of text, multi-byte characters among
    it)."""
    _, sess = await c.fresh()
    text = random_text(900_000)  # about 1 MiB
    data = text.encode()
    res = await run(c, sess, ["cat"], stdin=data)
    if res.exit_code != 0 or res.stdout != text:
        c.error(
            f"exec(cat) with {len(data)} bytes of stdin: exit code {res.exit_code}, "
            f"{len(res.stdout.encode(errors='surrogateescape'))} bytes out, equal "
            f"{res.stdout == text}; want the input echoed byte for byte"
        )


@clause("Exec/NilStdin")
async def nil_stdin(c: Check) -> None:
    """stdin None (or empty) gives the command end-of-input at once."""
    _, sess = await c.fresh()
    for data in (None, b""):
        res, err = await attempt(sess.exec(["cat"], stdin=data, timeout_seconds=10))
        if err is not None or res is None:
            c.error(f"exec(cat) with stdin {data!r}: {err!r}; want cat to see end-of-input")
        elif (res.exit_code, res.stdout, res.stderr) != (0, "", ""):
            c.error(f"exec(cat) with stdin {data!r} = {res!r}; want exit 0 and no output")


@clause("Exec/LeftoverChild")
async def leftover_child(c: Check) -> None:
    """A process the command leaves running, holding the output pipes, does not keep exec from
    returning once the command itself has exited."""
    _, sess = await c.fresh()
    begin = time.monotonic()
    res, err = await attempt(sess.exec(sh_argv("sleep 30 & echo $!"), timeout_seconds=10))
    took = time.monotonic() - begin
    if err is not None or res is None:
        c.fatal(f"exec(sh -c 'sleep 30 & echo $!') after {took:.1f}s: {err!r}")
    if took > PROMPT:
        c.error(f"exec(sh -c 'sleep 30 & echo $!') took {took:.1f}s; it returns once sh exits")
    pid = res.stdout.strip()
    if not pid.isdigit() or res.exit_code != 0:
        c.error(f"exec(sh -c 'sleep 30 & echo $!') = {res!r}; want exit 0 and the child's pid")
        return
    await attempt(sess.exec(["kill", pid], timeout_seconds=EXEC_TIMEOUT))


@clause("Exec/OutputLimit")
async def output_limit(c: Check) -> None:
    """Output beyond what the provider holds in memory fails exec with a
    SandboxOutputLimitError carrying the lengths received, exact when the output stops past
    the limit; it is never silently truncated."""
    _, sess = await c.fresh()
    n = 100 << 20
    res, err = await attempt(sess.exec(["head", "-c", str(n), "/dev/zero"], timeout_seconds=30))
    if err is None and res is not None:
        if res.exit_code != 0 or len(res.stdout) != n:
            c.error(
                f"exec(head -c {n} /dev/zero) = exit code {res.exit_code} with "
                f"{len(res.stdout)} bytes and no error; want all, or a SandboxOutputLimitError"
            )
        return
    what = "exec of 100 MiB of output"
    if not want_kind(c, err, E.SandboxOutputLimitError, what):
        return
    ol = cast(E.SandboxOutputLimitError, err)
    if ol.stdout_len <= 0 or ol.stdout_len < ol.limit:
        c.error(f"{what}: limit {ol.limit}, stdout_len {ol.stdout_len}; want the length received")
    over = ol.limit + 1
    _, err = await attempt(
        sess.exec(
            sh_argv('printf abc >&2; head -c "$1" /dev/zero; sleep 30', str(over)),
            timeout_seconds=30,
        )
    )
    what = f"exec of 3 bytes of stderr, then {over} bytes of stdout (one past the limit)"
    if want_kind(c, err, E.SandboxOutputLimitError, what):
        ol = cast(E.SandboxOutputLimitError, err)
        if (ol.stdout_len, ol.stderr_len) != (over, 3):
            c.error(f"{what}: lengths {ol.stdout_len}, {ol.stderr_len}; want {over} and 3")
    res = await run(c, sess, ["echo", "ok"])
    if res.stdout != "ok\n":
        c.error(f"exec(echo ok) after an output-limit failure = {res!r}; the session stays usable")


@clause("Exec/Concurrent")
async def concurrent(c: Check) -> None:
    """Execs on one session may run concurrently, each with its own result."""
    _, sess = await c.fresh()

    async def one(i: int) -> None:
        res, err = await attempt(
            sess.exec(sh_argv('sleep 0.1; printf %s "$1"', str(i)), timeout_seconds=EXEC_TIMEOUT)
        )
        if err is not None or res is None or (res.exit_code, res.stdout) != (0, str(i)):
            c.error(f"concurrent exec {i} = {res!r}, {err!r}; want stdout {str(i)!r}")

    await asyncio.gather(*(one(i) for i in range(8)))
