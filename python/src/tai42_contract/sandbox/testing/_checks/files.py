"""Files/...: put_file and get_file, workspace-relative, and their errors."""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile

from ... import errors as E
from ...base import SandboxSession
from .._helpers import (
    EXEC_TIMEOUT,
    attempt,
    exists,
    host_exists,
    host_read,
    must_get,
    must_put,
    must_sh,
    random_bytes,
    run,
    sh_argv,
    want_kind,
    want_plain_path,
)
from .._suite import Check, clause


async def round_trip(c: Check, sess: SandboxSession, put: str, get: str, data: bytes) -> None:
    await must_put(c, sess, put, data)
    if (got := await must_get(c, sess, get)) != data:
        c.error(
            f"get_file({get!r}) after put_file({put!r}) of {len(data)} bytes returned "
            f"{len(got)} bytes (equal: False); want the bytes put, intact"
        )


@clause("Files/RoundTrip")
async def files_round_trip(c: Check) -> None:
    """Binary data round-trips intact: every byte value, 4 MiB of random bytes, an empty
    file."""
    _, sess = await c.fresh()
    await round_trip(c, sess, "every-byte.bin", "every-byte.bin", bytes(range(256)))
    await round_trip(c, sess, "random.bin", "random.bin", random_bytes(4 << 20))
    await round_trip(c, sess, "empty.bin", "empty.bin", b"")


@clause("Files/Parents")
async def parents(c: Check) -> None:
    """put_file creates missing parent directories."""
    _, sess = await c.fresh()
    await round_trip(c, sess, "a/b/c/f.bin", "a/b/c/f.bin", b"deep")
    await must_sh(c, sess, "[ -d a/b/c ]")


@clause("Files/Overwrite")
async def overwrite(c: Check) -> None:
    """put_file replaces an existing file whole: no tail of the old content stays."""
    _, sess = await c.fresh()
    await must_put(c, sess, "f.txt", b"long content " * 100)
    await round_trip(c, sess, "f.txt", "f.txt", b"short")


@clause("Files/AtomicReplace")
async def atomic_replace(c: Check) -> None:
    """put_file replaces a file atomically: get_file and an exec reading it while it is
    replaced over and over see the old content or the new, whole, never a part or an empty
    file."""
    _, sess = await c.fresh()
    size = 1 << 20
    a, b = b"a" * size, b"b" * size
    await must_put(c, sess, "f.bin", a)
    stop = asyncio.Event()
    seen: set[str] = set()

    async def writer() -> None:
        try:
            for i in range(30):
                _, err = await attempt(sess.put_file("f.bin", b if i % 2 == 0 else a))
                if err is not None:
                    c.error(f"put_file #{i} over the file: {err!r}")
                    return
        finally:
            stop.set()

    async def reader(snap: str) -> None:
        while not stop.is_set():
            data, err = await attempt(sess.get_file("f.bin"))
            if err is not None or data is None:
                c.error(f"get_file while the file is replaced: {err!r}")
                return
            if data not in (a, b):
                seen.add(f"get_file read {len(data)} bytes, not one content whole")
            # One read of the file, then its length and ends.
            res = await run(
                c,
                sess,
                sh_argv('cat f.bin > "$1"; wc -c < "$1"; head -c1 "$1"; tail -c1 "$1"', snap),
            )
            lines = res.stdout.split()
            if (
                res.exit_code != 0
                or not lines
                or lines[0] != str(size)
                or lines[1:]
                not in (
                    ["aa"],
                    ["bb"],
                )
            ):
                seen.add(f"an exec read {res.stdout!r} ({res.stderr!r}), not one content whole")

    await asyncio.gather(writer(), reader("snap1"), reader("snap2"))
    for s in sorted(seen):
        c.error(s + "; put_file replaces a file atomically")


@clause("Files/AbsoluteInside")
async def absolute_inside(c: Check) -> None:
    """An absolute path inside the workspace is the same file as the relative one."""
    _, sess = await c.fresh()
    ws = sess.workspace_path
    await round_trip(c, sess, os.path.join(ws, "abs", "f.txt"), "abs/f.txt", b"absolute")
    await round_trip(c, sess, "abs/g.txt", os.path.join(ws, "abs", "g.txt"), b"relative")


@clause("Files/SharedWithExec")
async def shared_with_exec(c: Check) -> None:
    """Files put are what execs see (relative to their default cwd, the workspace), and files
    execs make are what get_file reads."""
    _, sess = await c.fresh()
    await must_put(c, sess, "in/put.txt", b"from put_file")
    if (got := await must_sh(c, sess, "cat in/put.txt")) != "from put_file":
        c.error(f"exec(cat in/put.txt) = {got!r}; want 'from put_file'")
    await must_sh(c, sess, "mkdir -p out && printf 'from exec' > out/made.txt")
    if (data := await must_get(c, sess, "out/made.txt")) != b"from exec":
        c.error(f"get_file(out/made.txt) = {data!r}; want b'from exec', the file the exec made")


@clause("Files/NotFound")
async def files_not_found(c: Check) -> None:
    """get_file of a path where nothing exists raises SandboxFileNotFoundError carrying the
    path."""
    _, sess = await c.fresh()
    for p in (
        "missing.txt",
        "no/such/dir/missing.txt",
        os.path.join(sess.workspace_path, "missing.txt"),
    ):
        _, err = await attempt(sess.get_file(p))
        what = f"get_file({p!r}) where nothing exists"
        if want_kind(c, err, E.SandboxFileNotFoundError, what):
            path = getattr(err, "path", None)
            if not isinstance(path, str) or "missing.txt" not in path:
                c.error(f"{what}: SandboxFileNotFoundError.path = {path!r}; want the path")


@clause("Files/Directory")
async def directory(c: Check) -> None:
    """get_file of a directory raises the base SandboxError naming the path, never
    SandboxFileNotFoundError: something exists there."""
    _, sess = await c.fresh()
    await must_put(c, sess, "d/f", b"f")
    for p in ("d", "d/", ".", sess.workspace_path):
        _, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r}) of a directory")


@clause("Files/PutOverDirectory")
async def put_over_directory(c: Check) -> None:
    """put_file over a directory raises the base SandboxError and leaves the directory as it
    was."""
    _, sess = await c.fresh()
    await must_put(c, sess, "d/f", b"kept")
    _, err = await attempt(sess.put_file("d", b"over"))
    want_plain_path(c, err, "d", "put_file onto a directory")
    if (got := await must_get(c, sess, "d/f")) != b"kept":
        c.error(f"get_file(d/f) after a put_file onto d = {got!r}; want b'kept'")


@clause("Files/Unreadable")
async def unreadable(c: Check) -> None:
    """get_file of something that exists but cannot be read as a file (a FIFO, a symlink loop)
    raises the base SandboxError naming the path, promptly."""
    _, sess = await c.fresh()
    await must_sh(c, sess, "mkfifo fifo && ln -s loop loop")
    for p, what in (("fifo", "a FIFO"), ("loop", "a symlink loop")):
        try:
            _, err = await asyncio.wait_for(attempt(sess.get_file(p)), 10)
        except asyncio.TimeoutError:
            c.error(f"get_file({p!r}) of {what} did not return within 10 s")
            continue
        want_plain_path(c, err, p, f"get_file({p!r}) of {what}")


@clause("Files/DanglingSymlink")
async def dangling_symlink(c: Check) -> None:
    """get_file of a symlink whose target, inside the workspace, does not exist raises the
    base SandboxError naming the path: the link exists, and SandboxFileNotFoundError is for
    where nothing exists, and only then."""
    _, sess = await c.fresh()
    await must_sh(
        c, sess, "mkdir d && ln -s missing-target dangling && ln -s ../missing-target d/dangling"
    )
    for p in ("dangling", "d/dangling", os.path.join(sess.workspace_path, "dangling")):
        _, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r}) of a symlink to a missing file")


@clause("Files/PermissionDenied")
async def permission_denied(c: Check) -> None:
    """get_file of a file the session's user may not read, or below a directory it may not
    search, raises the base SandboxError naming the path: a permission error is a real fault,
    never reported as a missing file (skipped where the session's user reads anything)."""
    _, sess = await c.fresh()
    await must_sh(
        c,
        sess,
        "printf secret > locked && mkdir closed && printf secret > closed/f && "
        "chmod 000 locked closed",
    )

    async def restore() -> None:
        await attempt(sess.exec(["chmod", "755", "closed"], timeout_seconds=EXEC_TIMEOUT))

    c.defer(restore)
    if (await run(c, sess, ["cat", "locked"])).exit_code == 0:
        c.skip("the session's user reads a file of mode 000 (as root does): no permission error")
    for p, what in (
        ("locked", "a file without read permission"),
        ("closed/f", "a file below a directory without search permission"),
    ):
        _, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r}) of {what}")


@clause("Files/BadPaths")
async def bad_paths(c: Check) -> None:
    """An empty path or one holding a NUL byte is refused with the base SandboxError, and a
    path with a trailing slash (a directory's) is never written as a file."""
    _, sess = await c.fresh()
    for p in ("", "a\x00b"):
        _, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r})")
        _, err = await attempt(sess.put_file(p, b"x"))
        want_plain_path(c, err, p, f"put_file({p!r})")
    _, err = await attempt(sess.put_file("d/", b"x"))
    want_plain_path(c, err, "d/", "put_file('d/')")
    if await exists(c, sess, "d"):
        c.error("put_file('d/') wrote something at 'd'; a directory's path is not a file's")


def _host_file() -> tuple[tempfile.TemporaryDirectory[str], str]:
    d = tempfile.TemporaryDirectory(prefix="tai42-suite-")
    f = os.path.join(d.name, "host.txt")
    with open(f, "w") as fh:
        fh.write("host")
    return d, f


@clause("Files/Escapes")
async def escapes(c: Check) -> None:
    """A path climbing out of the workspace is refused with the base SandboxError (never
    SandboxFileNotFoundError) naming it, and nothing outside is read or written; for a
    provider on the host's filesystem, an absolute path outside too."""
    _, sess = await c.fresh()
    ws = sess.workspace_path
    name = "tai42-escape-" + secrets.token_hex(4)
    outside = os.path.join(os.path.dirname(ws), name)
    planted = (await run(c, sess, sh_argv('printf outside > "$1"', outside))).exit_code == 0
    if planted:

        async def unplant() -> None:
            await attempt(sess.exec(["rm", "-f", outside], timeout_seconds=EXEC_TIMEOUT))

        c.defer(unplant)
    paths = ["../" + name, "a/../../" + name, "./../" + name]
    if c.opts.absolute_outside_workspace_refused:
        paths.append(outside)
    for p in paths:
        data, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r}), outside the workspace")
        if data is not None and b"outside" in data:
            c.error(f"get_file({p!r}) read the file outside the workspace")
        _, err = await attempt(sess.put_file(p, b"written"))
        want_plain_path(c, err, p, f"put_file({p!r}), outside the workspace")
    if planted:
        if (got := await must_sh(c, sess, 'cat "$1"', outside)) != "outside":
            c.error(f"the file outside the workspace holds {got!r} after the refused put_files")
    elif await exists(c, sess, outside):
        c.error(f"a refused put_file created {outside}, outside the workspace")
    if not c.host_fs:
        return
    d, host_file = _host_file()
    with d:
        _, err = await attempt(sess.get_file(host_file))
        want_plain_path(c, err, host_file, "get_file of an absolute host path outside")
        new = os.path.join(d.name, "new.txt")
        _, err = await attempt(sess.put_file(new, b"x"))
        want_plain_path(c, err, new, "put_file of an absolute host path outside")
        if host_exists(new):
            c.error(f"the host path {new} exists after a refused put_file")


@clause("Files/SymlinkEscapes")
async def symlink_escapes(c: Check) -> None:
    """A symlink in the workspace that leads out is refused like a path that climbs out:
    nothing outside is read or written through it, and put_file onto a link to a host file
    never writes that file."""
    _, sess = await c.fresh()
    sh_path = (
        await must_sh(
            c,
            sess,
            'p=$(command -v sh); case $p in /*) echo "$p"; exit; esac; IFS=:; '
            'for d in $PATH; do [ -x "$d/sh" ] && { echo "$d/sh"; exit; }; done',
        )
    ).strip()
    if not os.path.isabs(sh_path):
        c.fatal(f"sh found at {sh_path!r}; want an absolute path")
    sh_dir = os.path.dirname(sh_path)
    await must_sh(c, sess, 'ln -s "$1" link && ln -s "$2" escape', sh_path, sh_dir)
    for p in ("link", "escape/" + os.path.basename(sh_path)):
        _, err = await attempt(sess.get_file(p))
        want_plain_path(c, err, p, f"get_file({p!r}) through a symlink leading out")
    name = "tai42-escape-" + secrets.token_hex(4)
    _, err = await attempt(sess.put_file("escape/" + name, b"x"))
    want_plain_path(c, err, "escape/" + name, "put_file through a symlink leading out")
    if await exists(c, sess, os.path.join(sh_dir, name)):
        c.error(f"put_file through the symlink created {os.path.join(sh_dir, name)}, outside")
    if not c.host_fs:
        return
    d, host_file = _host_file()
    with d:
        await must_sh(c, sess, 'ln -s "$1" hostdir && ln -s "$2" hostfile', d.name, host_file)
        for p in ("hostdir/host.txt", "hostfile"):
            _, err = await attempt(sess.get_file(p))
            want_plain_path(c, err, p, f"get_file({p!r}) through a symlink to the host")
        _, err = await attempt(sess.put_file("hostdir/new.txt", b"x"))
        want_plain_path(c, err, "hostdir/new.txt", "put_file through a symlink to a host dir")
        if host_exists(os.path.join(d.name, "new.txt")):
            c.error("a put_file through a symlink to a host directory wrote there")
        await attempt(sess.put_file("hostfile", b"overwritten"))
        if (got := host_read(host_file)) != "host":
            c.error(f"the host file holds {got!r} after put_file onto a symlink to it")
