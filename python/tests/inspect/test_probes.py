"""The probe scripts that tell IsADirectoryError and PermissionError from
other failures, run by this machine's /bin/sh as an unprivileged user (as
nobody when the tests run as root), against files the test lays out: what
each prints for each kind of path."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tai42_sandbox.inspect._exec import EXEC_PROBE, FILE_PROBE, PINNED_PATH


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: no unprivileged user to probe as")
    return [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def _run(script: str, cwd: Path, *args: str) -> str:
    out = subprocess.run(
        [*_as_user(), "/bin/sh", "-c", script, "tai42-probe", *args],
        cwd=cwd,
        env={"PATH": PINNED_PATH},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def tree() -> Iterator[Path]:
    # Not under pytest's tmp_path, whose parents the prober may not enter.
    top = Path(tempfile.mkdtemp(prefix="tai42-probe-"))
    top.chmod(0o755)
    root = top / "tree"
    root.mkdir()
    (root / "dir").mkdir()
    (root / "plain").write_text("x")
    (root / "secret").write_text("x")
    (root / "secret").chmod(0o000)
    (root / "readonly").write_text("x")
    (root / "readonly").chmod(0o444)
    (root / "locked").mkdir()
    (root / "locked").chmod(0o555)
    (root / "tool").write_text("#!/bin/sh\n")
    (root / "tool").chmod(0o755)
    (root / "data").write_text("x")
    (root / "data").chmod(0o644)
    # Open for the unprivileged user: everything but what the case denies.
    root.chmod(0o777)
    yield root
    (root / "locked").chmod(0o755)
    shutil.rmtree(top)


@pytest.mark.parametrize(
    ("path", "access", "found"),
    [
        ("dir", "read", "directory"),
        ("dir", "write", "directory"),
        ("plain", "read", ""),
        ("secret", "read", "denied"),
        ("missing", "read", ""),
        ("readonly", "write", "denied"),
        ("plain", "write", "denied"),  # made by the test's user, not the prober's
        ("new-file", "write", ""),
        ("new/deep/file", "write", ""),
        ("locked/new-file", "write", "denied"),
        ("locked/missing/deep/file", "write", "denied"),
    ],
)
def test_file_probe(tree: Path, path: str, access: str, found: str) -> None:
    if os.geteuid() != 0 and path == "plain" and access == "write":
        found = ""  # the prober owns the file when it is not root
    assert _run(FILE_PROBE, tree, path, access) == found
    assert _run(FILE_PROBE, Path("/"), str(tree / path), access) == found


def test_file_probe_relative_to_a_locked_cwd(tree: Path) -> None:
    assert _run(FILE_PROBE, tree / "locked", "new-file", "write") == "denied"


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("./data", "denied"),
        ("./dir", "denied"),
        ("./tool", ""),
        ("./missing", ""),
        ("sh", ""),
        ("no-such-command-tai42", ""),
    ],
)
def test_exec_probe(tree: Path, command: str, found: str) -> None:
    assert _run(EXEC_PROBE, tree, command) == found
