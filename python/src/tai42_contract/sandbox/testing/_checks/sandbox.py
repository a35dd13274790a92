"""Sandbox/..., Session/... and Durability/...: the session lifecycle."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from datetime import timedelta

from ... import errors as E
from ...base import Sandbox, SandboxSession
from ...models import SandboxSessionInfo
from .._helpers import (
    EXEC_TIMEOUT,
    PROMPT,
    attempt,
    eventually,
    host_entries,
    host_exists,
    host_isdir,
    must_get,
    must_put,
    must_sh,
    random_bytes,
    start,
    wait_expired,
    want_gone,
    want_kind,
    want_rejected,
)
from .._suite import EXACT, PERMISSIVE, Check, Config, clause


async def want_all_gone(c: Check, sess: SandboxSession, why: str) -> None:
    """Every method of sess but id, workspace_path and destroy raises a
    SandboxSessionNotFoundError; destroy is idempotent."""
    sid = sess.id
    if not sid or not sess.workspace_path:
        c.error(f"id {sid!r}, workspace_path {sess.workspace_path!r} {why}; both keep their values")
    _, err = await attempt(sess.info())
    want_gone(c, err, sid, "info() " + why)
    _, err = await attempt(sess.exec(["true"], timeout_seconds=EXEC_TIMEOUT))
    want_gone(c, err, sid, "exec() " + why)
    h, err = await attempt(sess.exec_start(["true"], timeout_seconds=EXEC_TIMEOUT))
    want_gone(c, err, sid, "exec_start() " + why)
    if h is not None:
        await attempt(h.kill())
    _, err = await attempt(sess.put_file("gone.txt", b"x"))
    want_gone(c, err, sid, "put_file() " + why)
    _, err = await attempt(sess.get_file("gone.txt"))
    want_gone(c, err, sid, "get_file() " + why)
    _, err = await attempt(sess.touch())
    want_gone(c, err, sid, "touch() " + why)
    _, err = await attempt(sess.destroy())
    if err is not None:
        c.error(f"destroy() {why}: {err!r}; want it idempotent on a gone session")


async def want_listed(c: Check, sb: Sandbox, *ids: str) -> list[SandboxSessionInfo]:
    """list_sessions holds exactly the sessions of ids."""
    got, err = await attempt(sb.list_sessions())
    if err is not None or got is None:
        c.fatal(f"list_sessions(): {err!r}")
    if not isinstance(got, list) or not all(isinstance(i, SandboxSessionInfo) for i in got):
        c.fatal(f"list_sessions() returned {got!r}; want a list of SandboxSessionInfo")
    listed = sorted(i.id for i in got)
    if listed != sorted(ids):
        c.error(f"list_sessions() lists {listed}; want exactly the live sessions {sorted(ids)}")
    return got


def same_info(a: SandboxSessionInfo, b: SandboxSessionInfo) -> bool:
    return a.model_dump() == b.model_dump()


async def info_of(c: Check, sess: SandboxSession) -> SandboxSessionInfo:
    info, err = await attempt(sess.info())
    if err is not None or info is None:
        c.fatal(f"info(): {err!r}")
    if not isinstance(info, SandboxSessionInfo):
        c.fatal(f"info() returned {info!r}, not a SandboxSessionInfo")
    return info


async def reap(c: Check, sb: Sandbox) -> list[str]:
    ids, err = await attempt(sb.reap())
    if err is not None or ids is None:
        c.fatal(f"reap(): {err!r}")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        c.fatal(f"reap() returned {ids!r}; want a list of session ids")
    return ids


def persistent() -> dict[str, str]:
    """The spec changes of a persistent session of a fresh key."""
    return {"durability": "persistent", "workspace_key": "suite-" + secrets.token_hex(6)}


# Sandbox/...


@clause("Sandbox/Defaults")
async def defaults(c: Check) -> None:
    """exec_default_timeout_seconds is the configured default (> 0) and reap_interval_seconds
    the cadence the sandbox was made with."""
    sb = await c.sandbox(EXACT)
    d = sb.exec_default_timeout_seconds
    if not isinstance(d, (int, float)) or not d > 0:
        c.error(f"exec_default_timeout_seconds = {d!r}; want the configured default, > 0")
    r = sb.reap_interval_seconds
    if r != EXACT.reap_interval_seconds:
        c.error(f"reap_interval_seconds = {r!r}; want {EXACT.reap_interval_seconds}, as configured")


@clause("Sandbox/GetSession")
async def get_session(c: Check) -> None:
    """get_session returns a live session by id, the same session, and raises
    SandboxSessionNotFoundError naming the id for an unknown one."""
    sb, sess = await c.fresh()
    got, err = await attempt(sb.get_session(sess.id))
    if err is not None or got is None:
        c.fatal(f"get_session({sess.id!r}) of a live session: {err!r}")
    if not isinstance(got, SandboxSession):
        c.fatal(f"get_session returned {got!r}, not a SandboxSession")
    if got.id != sess.id or got.workspace_path != sess.workspace_path:
        c.error(
            f"get_session({sess.id!r}) returned the session {got.id!r} at {got.workspace_path!r};"
            f" want {sess.id!r} at {sess.workspace_path!r}"
        )
    await must_put(c, sess, "f.txt", b"same")
    if (data := await must_get(c, got, "f.txt")) != b"same":
        c.error(f"the session from get_session reads {data!r}; want b'same', put through the other")
    unknown = "tai42-no-such-session"
    _, err = await attempt(sb.get_session(unknown))
    want_gone(c, err, unknown, "get_session of an unknown id")


@clause("Sandbox/ListSessions")
async def list_sessions(c: Check) -> None:
    """list_sessions returns every live session's state, the same as its info()."""
    sb = await c.sandbox()
    ids = [(await c.session(sb, labels={"n": str(i), "app/role": "list"})).id for i in range(3)]
    for info in await want_listed(c, sb, *ids):
        sess, err = await attempt(sb.get_session(info.id))
        if err is not None or sess is None:
            c.fatal(f"get_session({info.id!r}) of a listed session: {err!r}")
        own = await info_of(c, sess)
        if not same_info(info, own):
            c.error(f"list_sessions shows {info!r}; info() shows {own!r}; want the same state")
        if info.created_at > info.expires_at or info.labels.get("app/role") != "list":
            c.error(f"list_sessions shows {info!r}; want created_at <= expires_at and its labels")
    _, err = await attempt(sb.destroy_session(ids[0]))
    if err is not None:
        c.fatal(f"destroy_session: {err!r}")
    await want_listed(c, sb, *ids[1:])


@clause("Sandbox/ConcurrentCreate")
async def concurrent_create(c: Check) -> None:
    """Sessions may be created concurrently; each is its own."""
    sb = await c.sandbox()
    results = await asyncio.gather(*(attempt(sb.create_session(c.spec())) for _ in range(8)))
    ids: set[str] = set()
    paths: set[str] = set()
    for sess, err in results:
        if err is not None or sess is None:
            c.error(f"concurrent create_session: {err!r}")
            continue
        c.destroy_at_end(sb, sess.id)
        if sess.id in ids:
            c.error(f"two sessions share the id {sess.id!r}")
        # Sessions with filesystems of their own may all see their
        # workspace at one path; on a shared filesystem the paths differ.
        if c.host_fs and sess.workspace_path in paths:
            c.error(f"two sessions share the workspace {sess.workspace_path!r}")
        ids.add(sess.id)
        paths.add(sess.workspace_path)
    await want_listed(c, sb, *ids)


@clause("Sandbox/DestroySession")
async def destroy_session(c: Check) -> None:
    """destroy_session ends a session for good and is idempotent, on an unknown id too."""
    sb, sess = await c.fresh()
    for i in (1, 2):
        _, err = await attempt(sb.destroy_session(sess.id))
        if err is not None:
            c.error(f"destroy_session #{i}: {err!r}; it is idempotent on a gone session")
    _, err = await attempt(sb.destroy_session("tai42-no-such-session"))
    if err is not None:
        c.error(f"destroy_session of an unknown id: {err!r}; want None (idempotent)")
    _, err = await attempt(sb.get_session(sess.id))
    want_gone(c, err, sess.id, "get_session of a destroyed session")
    await want_listed(c, sb)
    await want_all_gone(c, sess, "of a session destroyed with destroy_session")


@clause("Sandbox/Reap")
async def reap_exact(c: Check) -> None:
    """reap destroys exactly the expired sessions and returns their ids, no other."""
    sb = await c.sandbox(EXACT)
    a, b = await c.session(sb, ttl_seconds=1), await c.session(sb, ttl_seconds=1)
    live = await c.session(sb, ttl_seconds=3600)
    await wait_expired(c, a, b)
    ids = await reap(c, sb)
    if sorted(ids) != sorted([a.id, b.id]):
        c.error(f"reap() = {sorted(ids)}; want exactly the expired sessions {sorted([a.id, b.id])}")
    if again := await reap(c, sb):
        c.error(f"a second reap() = {again}; want no ids: nothing else has expired")
    _, err = await attempt(sb.get_session(live.id))
    if err is not None:
        c.error(f"get_session of the unexpired session after reap: {err!r}")
    await want_listed(c, sb, live.id)


@clause("Sandbox/ConcurrentReap")
async def concurrent_reap(c: Check) -> None:
    """Reaps that run at once return each expired id once between them: every expired session
    is destroyed by exactly one of them, none twice."""
    sb = await c.sandbox(EXACT)
    expired = [await c.session(sb, ttl_seconds=1) for _ in range(6)]
    live = await c.session(sb, ttl_seconds=3600)
    await wait_expired(c, *expired)
    results = await asyncio.gather(*(attempt(sb.reap()) for _ in range(4)))
    got: list[str] = []
    for i, (ids, err) in enumerate(results):
        if err is not None or ids is None:
            c.error(f"reap {i + 1} of 4 at once: {err!r}")
            continue
        got += ids
    want = sorted(s.id for s in expired)
    if sorted(got) != want:
        c.error(f"4 reaps at once returned {sorted(got)} between them; want each once, {want}")
    await want_listed(c, sb, live.id)


@clause("Sandbox/ReapNotEarly")
async def reap_not_early(c: Check) -> None:
    """reap destroys a session only once its expires_at has passed: reap called over and over
    from the session's create on returns its id at or after expires_at, never before, and
    until then the session answers."""
    sb = await c.sandbox(EXACT)
    sess = await c.session(sb, ttl_seconds=1)
    info = await info_of(c, sess)
    expires = info.expires_at.timestamp()
    slack = 0.02  # beyond the clocks' reading: one machine's
    deadline = expires + 5
    while True:
        ids = await reap(c, sb)
        now = time.time()
        if sess.id in ids:
            if expires - now > slack:
                c.error(f"reap destroyed the session {expires - now:.3f}s before its expires_at")
            return
        if now > deadline:
            c.fatal("reap has not returned the session 5 s after its expires_at")
        if now < expires - slack:
            _, err = await attempt(sb.get_session(sess.id))
            if err is not None:
                c.fatal(f"get_session {expires - now:.3f}s before expires_at: {err!r}")
        await asyncio.sleep(0.01)


@clause("Sandbox/BackgroundReaper")
async def background_reaper(c: Check) -> None:
    """The background reaper destroys expired sessions on its own, at the cadence configured
    (reap_interval_seconds)."""
    cfg = Config(policy=PERMISSIVE, reap_interval_seconds=0.1)
    sb = await c.sandbox(cfg)
    if sb.reap_interval_seconds != cfg.reap_interval_seconds:
        c.error(f"reap_interval_seconds = {sb.reap_interval_seconds!r}; want 0.1, as configured")
    sess = await c.session(sb, ttl_seconds=1)
    await wait_expired(c, sess)
    await asyncio.sleep(1)  # ten sweeps of the reaper
    if c.host_fs:
        ws = sess.workspace_path

        async def removed() -> bool:
            return not host_exists(ws)

        if not await eventually(2, removed):
            c.error(
                f"the workspace {ws} of an ephemeral session expired for over a second still "
                "exists; the background reaper destroys it"
            )
    if ids := await reap(c, sb):
        c.error(
            f"reap() = {ids} a second after the session expired; want no ids, the background "
            "reaper having destroyed it already"
        )


# Session/...


@clause("Session/Info")
async def info(c: Check) -> None:
    """info() reports the session's observable state: its id, image, workspace_key, absolute
    workspace_path (the session's own), durability, created_at (the create's time),
    expires_at (created_at + ttl) and labels."""
    labels = {"team": "tai42", "app/role": "info", "empty": ""}
    before = time.time()
    _, sess = await c.fresh(labels=labels, workspace_key="info-key", ttl_seconds=600)
    after = time.time()
    got = await info_of(c, sess)
    want = SandboxSessionInfo(
        id=sess.id,
        image=c.opts.image,
        workspace_key="info-key",
        workspace_path=sess.workspace_path,
        durability="ephemeral",
        created_at=got.created_at,
        expires_at=got.created_at + timedelta(seconds=600),
        labels=labels,
    )
    if not same_info(got, want):
        c.error(f"info() = {got!r}; want {want!r}")
    if not os.path.isabs(got.workspace_path):
        c.error(f"info().workspace_path = {got.workspace_path!r}; want an absolute path")
    if got.created_at.tzinfo is None or got.expires_at.tzinfo is None:
        c.error(f"info() times {got.created_at!r}, {got.expires_at!r} carry no time zone")
    created = got.created_at.timestamp()
    if not before - 1 <= created <= after + 1:
        c.error(f"info().created_at = {got.created_at}; want the time of the create")


@clause("Session/Touch")
async def touch(c: Check) -> None:
    """touch() extends expires_at to now + ttl (no further) and never shortens it;
    created_at stays."""
    _, sess = await c.fresh(ttl_seconds=3600)
    prev = await info_of(c, sess)
    for i in (1, 2):
        before = time.time()
        _, err = await attempt(sess.touch())
        if err is not None:
            c.fatal(f"touch(): {err!r}")
        after = time.time()
        got = await info_of(c, sess)
        if got.expires_at.timestamp() < before + 3600:
            c.error(f"after touch #{i} expires_at = {got.expires_at}; want at least now + ttl")
        # The ttl counts from now, not from the old expires_at: touches that
        # added up would keep a session alive long after its client stopped.
        if got.expires_at.timestamp() > after + 3600 + 1:
            c.error(
                f"after touch #{i} expires_at = {got.expires_at}; want at most now + ttl "
                "(touches must not accumulate)"
            )
        if got.expires_at < prev.expires_at:
            c.error(f"touch #{i} moved expires_at back from {prev.expires_at} to {got.expires_at}")
        if got.created_at != prev.created_at:
            c.error(f"touch #{i} changed created_at from {prev.created_at} to {got.created_at}")
        prev = got


@clause("Session/Expiry")
async def expiry(c: Check) -> None:
    """An expired session is gone for consumers at once, before any reap: get_session,
    list_sessions and its every method say so."""
    sb = await c.sandbox(EXACT)
    sess = await c.session(sb, ttl_seconds=1)
    await wait_expired(c, sess)
    _, err = await attempt(sb.get_session(sess.id))
    want_gone(c, err, sess.id, "get_session of an expired session")
    await want_listed(c, sb)
    await want_all_gone(c, sess, "of an expired session")


@clause("Session/Destroy")
async def destroy(c: Check) -> None:
    """destroy() ends the session: get_session and every method then raise
    SandboxSessionNotFoundError, and destroy_session of it stays idempotent."""
    sb, sess = await c.fresh()
    _, err = await attempt(sess.destroy())
    if err is not None:
        c.fatal(f"destroy(): {err!r}")
    _, err = await attempt(sb.get_session(sess.id))
    want_gone(c, err, sess.id, "get_session of a destroyed session")
    _, err = await attempt(sb.destroy_session(sess.id))
    if err is not None:
        c.error(f"destroy_session of a destroyed session: {err!r}; want None (idempotent)")
    await want_all_gone(c, sess, "of a destroyed session")


@clause("Session/DestroyEndsExecs")
async def destroy_ends_execs(c: Check) -> None:
    """Destroying a session ends its running execs promptly: a running exec raises
    SandboxSessionNotFoundError, a handle's output ends with a SandboxError, and kill then
    never raises."""
    sb, sess = await c.fresh()
    running = c.task(attempt(sess.exec(["sleep", "30"], timeout_seconds=EXEC_TIMEOUT)))
    r = await start(c, sess, ["sleep", "30"])
    await asyncio.sleep(0.3)  # let both execs start
    begin = time.monotonic()
    _, err = await attempt(sb.destroy_session(sess.id))
    if err is not None:
        c.fatal(f"destroy_session: {err!r}")
    try:
        _, exec_err = await asyncio.wait_for(running, PROMPT)
    except asyncio.TimeoutError:
        c.fatal(f"a running exec had not returned {PROMPT}s after its session was destroyed")
    if (took := time.monotonic() - begin) > PROMPT:
        c.error(f"a running exec returned {took:.1f}s after its session was destroyed")
    want_gone(c, exec_err, sess.id, "a running exec of a destroyed session")
    await r.drain(PROMPT)
    if r.exit is not None:
        c.error(f"the output of an exec whose session was destroyed ended with {r.exit!r}")
    elif r.ended:
        want_kind(c, r.err, E.SandboxError, "the output of an exec whose session was destroyed")
    _, err = await attempt(r.h.kill())
    if err is not None:
        c.error(f"kill() of a handle whose session was destroyed: {err!r}; it never raises then")


@clause("Session/DestroyEndsLeftovers")
async def destroy_ends_leftovers(c: Check) -> None:
    """Destroying a session ends the processes its commands left running: a heartbeat they
    write stops (watched from the host, or through the persistent workspace of a provider
    whose sessions have filesystems of their own)."""
    if c.host_fs:
        await _leftovers_host(c)
    else:
        await _leftovers_durable(c)


_BEAT = 'i=0; while [ $i -lt 400 ]; do : > "$1/beat.$i"; i=$((i+1)); sleep 0.05; done'


async def _leftovers_host(c: Check) -> None:
    import tempfile

    sb, sess = await c.fresh()
    with tempfile.TemporaryDirectory(prefix="tai42-suite-") as d:
        os.chmod(d, 0o777)

        async def beats() -> int:
            return host_entries(d)

        async def some() -> bool:
            return await beats() > 0

        await must_sh(
            c, sess, 'sh -c "$1" beat "$2" >/dev/null 2>&1 </dev/null & echo $!', _BEAT, d
        )
        if not await eventually(3, some):
            c.skip(f"a process of the session could not write to the host directory {d}")
        _, err = await attempt(sb.destroy_session(sess.id))
        if err is not None:
            c.fatal(f"destroy_session: {err!r}")
        await asyncio.sleep(0.3)
        n = await beats()
        await asyncio.sleep(0.5)
        if (m := await beats()) != n:
            c.error(
                f"a process the session's command left running still runs after "
                f"destroy_session ({n} heartbeats, then {m}); destroying ends its processes"
            )


async def _leftovers_durable(c: Check) -> None:
    c.need_durable()
    sb = await c.sandbox()
    key = persistent()
    sess = await c.session(sb, **key)
    await must_sh(c, sess, 'sh -c "$1" beat . >/dev/null 2>&1 </dev/null & echo $!', _BEAT)

    async def beats(s: SandboxSession) -> int:
        out = await must_sh(c, s, 'set -- beat.*; [ -e "$1" ] && echo $# || echo 0')
        return int(out.strip())

    async def some() -> bool:
        return await beats(sess) > 0

    if not await eventually(3, some):
        c.fatal("the session's background heartbeat never wrote to its workspace")
    _, err = await attempt(sb.destroy_session(sess.id))
    if err is not None:
        c.fatal(f"destroy_session: {err!r}")
    nxt = await c.session(sb, **key)
    n = await beats(nxt)
    await asyncio.sleep(0.5)
    if (m := await beats(nxt)) != n:
        c.error(
            f"a process the session's command left running still runs after destroy_session "
            f"({n} heartbeats in its persistent workspace, then {m})"
        )


@clause("Session/ConcurrentDestroyAndExec")
async def concurrent_destroy_and_exec(c: Check) -> None:
    """destroy racing execs: every exec returns its correct result or raises
    SandboxSessionNotFoundError; none hangs."""
    sb = await c.sandbox()
    for rnd in range(3):
        sess = await c.session(sb)

        async def one(s: SandboxSession = sess) -> None:
            res, err = await attempt(s.exec(["echo", "hi"], timeout_seconds=EXEC_TIMEOUT))
            if err is not None:
                want_gone(c, err, s.id, "an exec racing destroy")
            elif res is None or (res.exit_code, res.stdout, res.stderr) != (0, "hi\n", ""):
                c.error(f"an exec racing destroy returned {res!r}; want the correct result")

        async def kill(s: SandboxSession = sess, delay: float = rnd * 0.005) -> None:
            await asyncio.sleep(delay)
            _, err = await attempt(s.destroy())
            if err is not None:
                c.error(f"destroy racing execs: {err!r}")

        await asyncio.gather(*(one() for _ in range(10)), kill())


# Durability/...


@clause("Durability/EphemeralEmpty")
async def ephemeral_empty(c: Check) -> None:
    """An ephemeral session starts with an empty workspace."""
    _, sess = await c.fresh()
    if got := await must_sh(c, sess, "ls -A"):
        c.error(f"ls -A in a new ephemeral workspace = {got!r}; want it empty")


@clause("Durability/EphemeralNotShared")
async def ephemeral_not_shared(c: Check) -> None:
    """Ephemeral sessions with the same workspace_key share nothing."""
    sb = await c.sandbox()
    a = await c.session(sb, workspace_key="shared-key")
    b = await c.session(sb, workspace_key="shared-key")
    if c.host_fs and a.workspace_path == b.workspace_path:
        c.error(f"two live ephemeral sessions share the workspace {a.workspace_path}")
    await must_put(c, a, "mine.txt", b"a")
    _, err = await attempt(b.get_file("mine.txt"))
    want_kind(
        c,
        err,
        E.SandboxFileNotFoundError,
        "get_file in an ephemeral session of a file put in another of the same workspace_key",
    )
    if got := await must_sh(c, b, "ls -A"):
        c.error(f"ls -A in the second ephemeral workspace = {got!r}; want it empty")


@clause("Durability/EphemeralRemoved")
async def ephemeral_removed(c: Check) -> None:
    """An ephemeral workspace is removed at destroy (checked from the host)."""
    c.need_host_fs()
    _, sess = await c.fresh()
    await must_put(c, sess, "d/f.txt", b"x")
    ws = sess.workspace_path
    if not host_isdir(ws):
        c.fatal(f"the workspace {ws} of a live session is not on the host")
    _, err = await attempt(sess.destroy())
    if err is not None:
        c.fatal(f"destroy(): {err!r}")
    if host_exists(ws):
        c.error(f"the ephemeral workspace {ws} still exists after destroy(); it is removed then")


@clause("Durability/Persistent")
async def persistent_survives(c: Check) -> None:
    """A persistent workspace survives its session: the next session with the same key sees
    its files, and info() shows it persistent with its key."""
    c.need_durable()
    sb = await c.sandbox()
    key = persistent()
    first = await c.session(sb, **key)
    got = await info_of(c, first)
    if got.durability != "persistent" or got.workspace_key != key["workspace_key"]:
        c.error(
            f"info() of a persistent session shows durability {got.durability!r}, workspace_key "
            f"{got.workspace_key!r}; want 'persistent', {key['workspace_key']!r}"
        )
    data = random_bytes(64 << 10)
    await must_put(c, first, "keep/data.bin", data)
    _, err = await attempt(first.destroy())
    if err is not None:
        c.fatal(f"destroy(): {err!r}")
    second = await c.session(sb, **key)
    if (back := await must_get(c, second, "keep/data.bin")) != data:
        c.error(
            f"a new session with the same persistent key reads {len(back)} bytes, not the "
            f"{len(data)} the destroyed one wrote"
        )


@clause("Durability/PersistentConflict")
async def persistent_conflict(c: Check) -> None:
    """One live session per persistent key: a second create is rejected (a
    SandboxSpecRejectedError naming the live session) and makes no session; once the first
    is gone the key is free."""
    c.need_durable()
    sb = await c.sandbox()
    key = persistent()
    live = await c.session(sb, **key)
    other, err = await attempt(sb.create_session(c.spec(**key)))
    if other is not None:
        c.destroy_at_end(sb, other.id)
    want_rejected(c, err, "conflict", "", "a second create_session with a live persistent key")
    if err is not None and live.id not in str(err):
        c.error(f"the conflict error {str(err)!r} does not name the live session {live.id!r}")
    await want_listed(c, sb, live.id)
    _, err = await attempt(live.destroy())
    if err is not None:
        c.fatal(f"destroy(): {err!r}")
    await c.session(sb, **key)


@clause("Durability/PersistentSurvivesReap")
async def persistent_survives_reap(c: Check) -> None:
    """A persistent workspace survives a reap of its expired session."""
    c.need_durable()
    sb = await c.sandbox(EXACT)
    key = persistent()
    old = await c.session(sb, **key, ttl_seconds=1)
    await must_put(c, old, "kept.txt", b"kept")
    await wait_expired(c, old)
    if (ids := await reap(c, sb)) != [old.id]:
        c.error(f"reap() = {ids}; want [{old.id!r}]")
    nxt = await c.session(sb, **key)
    if (got := await must_get(c, nxt, "kept.txt")) != b"kept":
        c.error(f"after a reap the persistent workspace reads {got!r}; want b'kept'")


@clause("Durability/PersistentExpiredIsNotLive")
async def persistent_expired_not_live(c: Check) -> None:
    """An expired session is no longer live: its persistent key is free at once, and the later
    reap leaves the workspace to its new session."""
    c.need_durable()
    sb = await c.sandbox(EXACT)
    key = persistent()
    old = await c.session(sb, **key, ttl_seconds=1)
    await must_put(c, old, "kept.txt", b"kept")
    await wait_expired(c, old)
    nxt, err = await attempt(sb.create_session(c.spec(**key)))
    if err is not None or nxt is None:
        c.fatal(
            f"create_session with the persistent key of an expired (not yet reaped) session: "
            f"{err!r}; an expired session is gone, not live"
        )
    c.destroy_at_end(sb, nxt.id)
    await reap(c, sb)
    if (got := await must_get(c, nxt, "kept.txt")) != b"kept":
        c.error(f"the new session reads {got!r} after the old one was reaped; want b'kept'")
    await must_put(c, nxt, "after.txt", b"x")
