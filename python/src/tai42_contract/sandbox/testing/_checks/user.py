"""User/...: the exec-as-user extension, an exec's ``user=`` keyword beyond
the contract's signature (a name, a uid, or uid:gid, resolved in the
session), for providers whose exec and exec_start take it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, cast

from ... import errors as E
from ...base import Sandbox, SandboxSession
from .._helpers import (
    EXEC_TIMEOUT,
    attempt,
    attempt_call,
    exists,
    run,
    secret_env,
    sh_argv,
    start,
    want_kind,
    want_plain,
)
from .._suite import Check, UserOptions, clause

# What an exec runs as: its uid, gid, HOME and working directory.
_ID_SCRIPT = 'printf \'%s %s|%s|%s\' "$(id -u)" "$(id -g)" "$HOME" "$(pwd)"'

# Users no session knows the form of (256 bytes is the longest a user may be).
MALFORMED = ("a:b", "0:", ":0", "1:2:3", "ro\x00ot", "a user", "-1", "4294967295", "u" * 257)


def _takes_user(sess: SandboxSession) -> bool:
    for name in ("exec", "exec_start"):
        try:
            params = inspect.signature(getattr(sess, name)).parameters.values()
        except (TypeError, ValueError):
            return False
        if not any(p.name == "user" or p.kind is p.VAR_KEYWORD for p in params):
            return False
    return True


async def _session(c: Check, **changes: Any) -> tuple[Sandbox, SandboxSession]:
    sb, sess = await c.fresh(**changes)
    if not _takes_user(sess):
        c.skip("the provider's exec and exec_start take no user keyword")
    return sb, sess


def _need_user(c: Check) -> UserOptions:
    if c.opts.user is None:
        c.skip("Options.user is None: the provider runs no exec as a user (User/Refused)")
    return c.opts.user


def _ids(u: UserOptions, ws: str) -> str:
    return f"{u.uid} {u.gid}|{u.home}|{ws}"


@clause("User/Name")
async def user_name(c: Check) -> None:
    """An exec as a user name runs with its passwd entry's uid and gid, its home as HOME, in
    the workspace (the default cwd); the exec after it, without a user, runs as before."""
    u = _need_user(c)
    _, sess = await _session(c)
    before = await run(c, sess, sh_argv(_ID_SCRIPT))
    res = await run(c, sess, sh_argv(_ID_SCRIPT), user=u.name)
    want = _ids(u, sess.workspace_path)
    if (res.exit_code, res.stdout) != (0, want):
        c.error(f"exec as {u.name!r} = {res!r}; want exit 0 and {want!r} (uid gid|HOME|cwd)")
    after = await run(c, sess, sh_argv(_ID_SCRIPT))
    if after != before:
        c.error(f"an exec without a user after one as {u.name!r}: {after!r}; want {before!r}")


@clause("User/UID")
async def user_uid(c: Check) -> None:
    """An exec as a decimal uid runs as that uid with its passwd entry's gid; as uid:gid with
    exactly those ids."""
    u = _need_user(c)
    _, sess = await _session(c)
    for spec in (str(u.uid), f"{u.uid}:{u.gid}"):
        res = await run(c, sess, sh_argv('printf \'%s %s\' "$(id -u)" "$(id -g)"'), user=spec)
        if (res.exit_code, res.stdout) != (0, f"{u.uid} {u.gid}"):
            c.error(f"exec as {spec!r} = {res!r}; want exit 0 and '{u.uid} {u.gid}'")


@clause("User/Home")
async def user_home(c: Check) -> None:
    """An exec as a user gets its home as HOME unless the spec's env or the exec's sets HOME,
    which then stands (the exec's over the spec's)."""
    u = _need_user(c)
    sb, sess = await _session(c, env=secret_env(TAI42_SUITE_KEEP="kept"))
    home = sh_argv('printf "%s|%s" "$HOME" "$TAI42_SUITE_KEEP"')
    res = await run(c, sess, home, user=u.name)
    if res.stdout != u.home + "|kept":
        c.error(f"exec as {u.name!r}: HOME|spec env = {res.stdout!r}; want {u.home + '|kept'!r}")
    env = secret_env(HOME="/tai42-exec-home")
    res = await run(c, sess, home, user=u.name, env=env)
    if res.stdout != "/tai42-exec-home|kept":
        c.error(f"exec as {u.name!r} with HOME in the exec's env: {res.stdout!r}; want that HOME")
    with_home = await c.session(sb, env=secret_env(HOME="/tai42-spec-home"))
    res = await run(c, with_home, sh_argv('printf %s "$HOME"'), user=u.name)
    if res.stdout != "/tai42-spec-home":
        c.error(f"exec as {u.name!r} in a session whose spec sets HOME: {res.stdout!r}")
    res = await run(c, with_home, sh_argv('printf %s "$HOME"'), user=u.name, env=env)
    if res.stdout != "/tai42-exec-home":
        c.error(f"exec as {u.name!r} with HOME in the spec's env and the exec's: {res.stdout!r}")


@clause("User/ExecStart")
async def user_exec_start(c: Check) -> None:
    """An interactive exec runs as its user too, stdin and all."""
    u = _need_user(c)
    _, sess = await _session(c)
    r = await start(
        c, sess, sh_argv("read line; " + _ID_SCRIPT + "; printf '|%s' \"$line\""), user=u.name
    )
    _, err = await attempt(r.h.write_stdin(b"hello\n"))
    if err is not None:
        c.fatal(f"write_stdin: {err!r}")
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "the script exits 0")
    want = _ids(u, sess.workspace_path) + "|hello"
    if r.stdout.decode(errors="replace") != want:
        c.error(f"exec_start as {u.name!r}: stdout {bytes(r.stdout)!r}; want {want!r}")


async def _ran(c: Check, sess: SandboxSession, *names: str) -> None:
    await asyncio.sleep(0.1)
    for name in names:
        if await exists(c, sess, name):
            c.error(f"a command refused for its user ran (it made {name})")


@clause("User/Unknown")
async def user_unknown(c: Check) -> None:
    """A user name the session does not know is refused before anything runs, by exec and
    exec_start alike, with a SandboxUserNotFoundError (a SandboxError) carrying the user and
    naming it."""
    _need_user(c)
    _, sess = await _session(c)
    loose = cast(Any, sess)
    unknown = "tai42-no-such-user"
    for call in ("exec", "exec_start"):
        got, err = await attempt_call(
            getattr(loose, call),
            sh_argv(f": > ran-{call}"),
            user=unknown,
            timeout_seconds=EXEC_TIMEOUT,
        )
        if got is not None and hasattr(got, "kill"):
            await attempt(got.kill())
        what = f"{call} as {unknown!r}"
        if not want_kind(c, err, E.SandboxUserNotFoundError, what):
            continue
        if getattr(err, "user", None) != unknown or unknown not in str(err):
            c.error(f"{what}: {err!r}; want a SandboxUserNotFoundError whose user is {unknown!r}")
    await _ran(c, sess, "ran-exec", "ran-exec_start")


@clause("User/Malformed")
async def user_malformed(c: Check) -> None:
    """A malformed user (a:b, a NUL, a space, an id out of range, too long) is refused with
    the base SandboxError by exec and exec_start alike, before anything runs: it is never
    taken for the default user."""
    _, sess = await _session(c)
    loose = cast(Any, sess)
    for u in MALFORMED:
        for call in ("exec", "exec_start"):
            got, err = await attempt_call(
                getattr(loose, call), sh_argv(": > ran"), user=u, timeout_seconds=EXEC_TIMEOUT
            )
            if got is not None and hasattr(got, "kill"):
                await attempt(got.kill())
            want_plain(c, err, f"{call} as the malformed user {u[:40]!r}")
    await _ran(c, sess, "ran")


@clause("User/Refused")
async def user_refused(c: Check) -> None:
    """A provider whose exec takes user= but runs no exec as a user (Options.user None)
    refuses one with a SandboxError, by exec and exec_start alike, and runs nothing: it never
    runs the exec as its default user instead."""
    if c.opts.user is not None:
        c.skip(f"Options.user names {c.opts.user.name!r}: the provider runs execs as users")
    _, sess = await _session(c)
    loose = cast(Any, sess)
    for u in ("nobody", "65534", "65534:65534"):
        for call in ("exec", "exec_start"):
            got, err = await attempt_call(
                getattr(loose, call), sh_argv(": > ran"), user=u, timeout_seconds=EXEC_TIMEOUT
            )
            if got is not None and hasattr(got, "kill"):
                await attempt(got.kill())
            if err is None:
                c.error(f"{call} as {u!r} ran; a provider that runs no exec as a user refuses it")
            else:
                want_kind(c, err, E.SandboxError, f"{call} as {u!r}")
    await _ran(c, sess, "ran")
