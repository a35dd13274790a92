"""User/...: the exec-as-user extension, an exec's ``user=`` keyword beyond
the contract's signature, for providers whose exec and exec_start take it."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, cast

from ... import errors as E
from ...base import SandboxSession
from .._helpers import EXEC_TIMEOUT, attempt, attempt_call, exists, run, sh_argv, start, want_kind
from .._suite import Check, clause


def _takes_user(sess: SandboxSession) -> bool:
    for name in ("exec", "exec_start"):
        try:
            params = inspect.signature(getattr(sess, name)).parameters.values()
        except (TypeError, ValueError):
            return False
        if not any(p.name == "user" or p.kind is p.VAR_KEYWORD for p in params):
            return False
    return True


async def _session(c: Check, want_user: bool) -> SandboxSession:
    _, sess = await c.fresh()
    if not _takes_user(sess):
        c.skip("the provider's exec and exec_start take no user keyword")
    if want_user and c.opts.user is None:
        c.skip("Options.user is None: no user the image knows is named")
    if not want_user and c.opts.user is not None:
        c.skip(f"Options.user is {c.opts.user!r}: the provider runs execs as users")
    return sess


def _whoami(user: str) -> tuple[list[str], str]:
    """The command that prints who an exec runs as, and what it must print
    for user (a name, or uid[:gid])."""
    uid, _, gid = user.partition(":")
    if uid.isdigit():
        script = 'printf "%s:%s" "$(id -u)" "$(id -g)"' if gid else 'printf %s "$(id -u)"'
        return sh_argv(script), user
    return sh_argv('printf %s "$(id -un)"'), user


@clause("User/Exec")
async def user_exec(c: Check) -> None:
    """exec with user= runs the command as that user (Options.user, a user the image knows)."""
    sess = await _session(c, want_user=True)
    user = cast(str, c.opts.user)
    argv, want = _whoami(user)
    res = await run(c, sess, argv, user=user)
    if (res.exit_code, res.stdout) != (0, want):
        c.error(f"exec(id) with user={user!r} = {res!r}; want exit 0 and {want!r}")


@clause("User/ExecStart")
async def user_exec_start(c: Check) -> None:
    """exec_start with user= runs the command as that user too."""
    sess = await _session(c, want_user=True)
    user = cast(str, c.opts.user)
    argv, want = _whoami(user)
    r = await start(c, sess, argv, user=user)
    await r.drain(EXEC_TIMEOUT)
    r.want_exit(0, "id succeeds")
    if r.stdout.decode(errors="replace") != want:
        c.error(f"exec_start(id) with user={user!r} printed {bytes(r.stdout)!r}; want {want!r}")


@clause("User/Unknown")
async def user_unknown(c: Check) -> None:
    """A user the session does not know is refused before anything runs, by exec and
    exec_start, with a SandboxUserNotFoundError (a SandboxError) carrying the user."""
    sess = await _session(c, want_user=True)
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
        what = f"{call} with user={unknown!r}"
        if (
            want_kind(c, err, E.SandboxUserNotFoundError, what)
            and getattr(err, "user", None) != unknown
        ):
            c.error(f"SandboxUserNotFoundError.user = {getattr(err, 'user', None)!r}")
    await asyncio.sleep(0.1)
    for call in ("exec", "exec_start"):
        if await exists(c, sess, f"ran-{call}"):
            c.error(f"{call} with an unknown user ran the command")


@clause("User/Refused")
async def user_refused(c: Check) -> None:
    """A provider whose exec takes user= but runs no exec as another user (Options.user None)
    refuses it with a SandboxError, by exec and exec_start, never ignoring it."""
    sess = await _session(c, want_user=False)
    loose = cast(Any, sess)
    for call in ("exec", "exec_start"):
        got, err = await attempt_call(
            getattr(loose, call),
            sh_argv(f": > ran-{call}"),
            user="nobody",
            timeout_seconds=EXEC_TIMEOUT,
        )
        if got is not None and hasattr(got, "kill"):
            await attempt(got.kill())
        want_kind(c, err, E.SandboxError, f"{call} with user='nobody'")
    await asyncio.sleep(0.1)
    for call in ("exec", "exec_start"):
        if await exists(c, sess, f"ran-{call}"):
            c.error(f"{call} with a user it does not run as ran the command")
