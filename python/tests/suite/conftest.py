"""The suite's daemons: a ``tai42 serve`` per sandbox the conformance suite
asks for, with the Config's policy and reap interval, its log lines (at
debug) routed to the Config's log, stopped by PID when the suite is done
with it. ``suite_provider`` is parametrized over the providers available;
``suite_factory`` and ``suite_options`` are the suite's Factory and Options
for it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tai42_contract.sandbox import Sandbox
from tai42_contract.sandbox.testing import Config, ConfigRefused, Factory, Options, UserOptions
from tai42_sandbox import Tai42Sandbox

from ..conftest import Daemon, _providers


def daemon_flags(cfg: Config) -> tuple[str, ...]:
    """The serve flags of a daemon made for cfg."""
    p = cfg.policy
    flags = [
        "--log-level",
        "debug",
        "--policy-egress",
        p.egress,
        "--policy-isolation",
        p.isolation,
        f"--policy-durable={str(p.durable).lower()}",
        f"--policy-scrub-transcript={str(p.scrub_transcript).lower()}",
    ]
    if cfg.reap_interval_seconds is not None:
        flags += ["--reap-interval", f"{round(cfg.reap_interval_seconds * 1000)}ms"]
    return tuple(flags)


def _read_from(path: Path, pos: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read()


async def _tail(path: Path, log: Callable[[str], None], stop: asyncio.Event) -> None:
    """Hand every line written to path to log, until stop is set and the
    file is read to its end."""
    pos = 0
    partial = b""
    while True:
        stopping = stop.is_set()
        with contextlib.suppress(FileNotFoundError):
            data = _read_from(path, pos)
            pos += len(data)
            *lines, partial = (partial + data).split(b"\n")
            for line in lines:
                log(line.decode(errors="replace"))
        if stopping:
            if partial:
                log(partial.decode(errors="replace"))
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


def _terminate(d: Daemon) -> None:
    """SIGTERM and wait: the daemon destroys its sessions and exits."""
    if d.proc is not None and d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(30)


NOBODY = 65534


def _as_nobody(d: Daemon) -> None:
    """Make d run as nobody: its directory and a copy of its binary become
    nobody's, and setpriv drops root before the daemon starts."""
    binary = d.dir / "tai42"
    shutil.copy(d.args[0], binary)
    os.chmod(d.dir, 0o755)
    os.chown(d.dir, NOBODY, NOBODY)
    d.args = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        str(binary),
        *d.args[1:],
    ]


def daemon_factory(binary: str, provider: str, *, nobody: bool = False) -> Factory:
    """The suite's Factory: a fresh daemon for each Config, through a
    connected Tai42Sandbox; run as nobody if asked (as root only)."""

    @contextlib.asynccontextmanager
    async def factory(cfg: Config) -> AsyncIterator[Sandbox]:
        d = Daemon(binary, provider, daemon_flags(cfg))
        if nobody:
            _as_nobody(d)
        try:
            try:
                await asyncio.to_thread(d.start)
            except Exception as e:
                # Exit code 2: serve refused its flags, as it refuses a
                # policy whose floor its provider can never meet.
                if d.proc is not None and d.proc.returncode == 2:
                    raise ConfigRefused(f"tai42 serve refused {daemon_flags(cfg)}") from e
                raise
            stop = asyncio.Event()
            tail = asyncio.ensure_future(_tail(d.log, cfg.log, stop))
            try:
                async with Tai42Sandbox(d.url, d.token) as sb:
                    yield sb
            finally:
                await asyncio.to_thread(_terminate, d)
                stop.set()
                await tail
        finally:
            await asyncio.to_thread(d.stop)

    return factory


def suite_user(name: str) -> UserOptions | None:
    """The host's user name (its /etc/passwd entry) as the suite's
    UserOptions, or None when there is none."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return UserOptions(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir)


def options_for(provider: str, *, root: bool | None = None) -> Options:
    """What each provider documents that it honours (as the Go suite's
    hosttest and containertest state it), served by a daemon as root or
    not (by default: as this process is). Execs run as nobody, where the
    daemon runs as root; else as the daemon's own user, the only one it
    can."""
    if root is None:
        root = os.geteuid() == 0
    if provider == "container":
        # The host image's users are the host's; its user namespace maps 65536 ids.
        user = suite_user("nobody")
        if user is None or max(user.uid, user.gid) >= 65536:
            user = suite_user("root")
        return Options(
            image="host",
            isolation="container",
            networks=("none", "internal", "egress"),
            durable=True,
            caps=True,
            kill_stops_leftovers=True,
            logs=True,
            user=user,
        )
    own = "nobody" if root or os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    return Options(
        image="host",
        isolation="none",
        networks=("none", "egress") if root else ("egress",),
        durable=True,
        caps=root,
        absolute_outside_workspace_refused=True,
        kill_stops_leftovers=True,
        logs=True,
        user=suite_user(own),
    )


@pytest.fixture(scope="session", params=_providers())
def suite_provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def suite_factory(tai42_bin: str, suite_provider: str) -> Factory:
    return daemon_factory(tai42_bin, suite_provider)


@pytest.fixture
def suite_options(suite_provider: str) -> Options:
    return options_for(suite_provider)
