"""The README's Python quick start runs as written: its Python program,
taken from between the README's python-quickstart markers, runs against a
real daemon and prints what the README's program prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import Daemon

README = Path(__file__).resolve().parents[2] / "README.md"


def _quickstart() -> tuple[str, str]:
    text = README.read_text()
    block = re.search(
        r"<!-- python-quickstart -->\n```sh\n(.*?)```\n<!-- /python-quickstart -->", text, re.S
    )
    assert block, "README.md has no python-quickstart block"
    program = re.search(r"<<'PY'\n(.*?)\nPY\n", block.group(1), re.S)
    assert program, "the quick start has no <<'PY' program"
    return block.group(1), program.group(1)


def test_quickstart_runs_as_written(daemon: Daemon) -> None:
    shell, program = _quickstart()
    # The shell half: the install and the daemon it starts are what the
    # test fixtures do; check it names the same program and sets both vars.
    assert "pip install -q ./python" in shell
    assert "TAI42_URL=" in shell
    assert "TAI42_TOKEN=" in shell
    env = {**os.environ, "TAI42_URL": daemon.url, "TAI42_TOKEN": daemon.token}
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("0 hello from /"), lines
    assert lines[1:] == ["stdout b'STREAMED\\n'", "b'kept'"], lines
