"""One eval end to end, as a user runs it: ``inspect eval task.py --sandbox
tai42`` with a daemon running (TAI42_URL, TAI42_TOKEN) and a tai42.yaml
beside the task, Inspect's mock model calling the bash() tool once.

Inspect finds the sandbox through the package's ``inspect_ai`` entry point:
the test lays a dist-info holding the entry points pyproject.toml declares
on the eval's PYTHONPATH, so it checks the declaration itself, installed or
not. The scorer, run in the sample while its session lives, reads the file
the tool wrote and records the session; after the eval no session of it is
left on the daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from tai42_sandbox import Tai42Sandbox

from .conftest import InspectDaemon

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

PYTHON_DIR = Path(__file__).resolve().parents[2]

TASK = """
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import sandbox

from tai42_sandbox.inspect import Tai42SandboxEnvironment

COMMAND = "echo from-bash > marker.txt; pwd; tr '\\\\0' ' ' < /proc/1/cmdline"


@scorer(metrics=[accuracy()])
def in_sandbox():
    async def score(state: TaskState, target: Target) -> Score:
        env = sandbox().as_type(Tai42SandboxEnvironment)
        info = await env.session.info()
        marker = await sandbox().read_file("marker.txt")
        return Score(
            value=CORRECT if marker == target.text + "\\n" else INCORRECT,
            metadata={
                "session_id": env.session_id,
                "workspace_path": info.workspace_path,
                "labels": info.labels,
                "tool_output": [m.text for m in state.messages if m.role == "tool"],
            },
        )

    return score


def _counted(output: ModelOutput) -> ModelOutput:
    # Usage given, so that mockllm does not count tokens with tiktoken,
    # which would download its encoding.
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@task
def bash_in_tai42():
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash", {"command": COMMAND}),
        ModelOutput.from_content("mockllm/model", "done"),
    ]
    model = get_model("mockllm/model", custom_outputs=[_counted(o) for o in outputs])
    return Task(
        dataset=[Sample(id="s1", input="run the command", target="from-bash")],
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=in_sandbox(),
        model=model,
    )
"""


def _entry_points_site(where: Path) -> Path:
    """A directory holding a dist-info whose entry_points.txt is the one
    pyproject.toml declares (the inspect_ai group)."""
    project = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["inspect_ai"]
    info = where / "tai42_sandbox_entry_points-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tai42-sandbox-entry-points\nVersion: 0\n"
    )
    lines = ["[inspect_ai]", *(f"{k} = {v}" for k, v in group.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return where


class Cli:
    """Inspect's command line in a task directory holding task.py and a
    tai42.yaml, with the daemon in TAI42_URL and TAI42_TOKEN and the
    package's entry points on the path."""

    def __init__(self, d: InspectDaemon, tmp_path: Path) -> None:
        self.task_dir = tmp_path / "task"
        self.task_dir.mkdir()
        (self.task_dir / "task.py").write_text(TASK)
        (self.task_dir / "tai42.yaml").write_text(f"image: {d.image}\nttl_seconds: 600\n")
        self.logs = tmp_path / "logs"
        site = _entry_points_site(tmp_path / "site")
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(site), str(PYTHON_DIR / "src")]),
            "TAI42_URL": d.daemon.url,
            "TAI42_TOKEN": d.daemon.token,
            "INSPECT_LOG_LEVEL": "warning",
        }

    async def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "inspect_ai", *args]
        inspect_cli = partial(
            subprocess.run,
            cmd,
            cwd=self.task_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        done = await anyio.to_thread.run_sync(inspect_cli)
        assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done

    async def eval(self, *args: str) -> tuple[dict[str, Any], str]:
        """The one sample of an `inspect eval task.py --sandbox tai42`, and
        what the eval printed."""
        done = await self.run(
            "eval",
            "task.py",
            "--sandbox",
            "tai42",
            "--log-dir",
            str(self.logs),
            "--log-format",
            "json",
            "--display",
            "none",
            *args,
        )
        [log_file] = self.logs.glob("*.json")
        log: dict[str, Any] = json.loads(log_file.read_text())
        assert log["status"] == "success", log.get("error")
        assert log["eval"]["sandbox"]["type"] == "tai42"
        [sample] = log["samples"]
        sample_log: dict[str, Any] = sample
        return sample_log, done.stdout + done.stderr


async def _inspect_sessions(d: InspectDaemon) -> list[str]:
    async with Tai42Sandbox(d.daemon.url, d.daemon.token) as sb:
        return [s.id for s in await sb.list_sessions() if "inspect-ai/run" in s.labels]


async def test_inspect_eval_cli(inspect_daemon: InspectDaemon, tmp_path: Path) -> None:
    d = inspect_daemon
    sample, _ = await Cli(d, tmp_path).eval()
    [score] = sample["scores"].values()
    assert score["value"] == "C", "the scorer did not find the file bash() wrote"
    meta = score["metadata"]
    [tool_output] = meta["tool_output"]
    pwd, pid1 = tool_output.splitlines()[:2]
    assert pwd == meta["workspace_path"], "bash() did not run in the session's workspace"
    if d.provider == "container":
        assert pwd == "/workspace"
        assert "agent" in pid1, f"PID 1 is not the in-sandbox agent: {pid1!r}"
    labels = meta["labels"]
    assert labels["inspect-ai/task"] == "bash_in_tai42"
    assert labels["inspect-ai/sample"] == "s1"
    assert labels["inspect-ai/epoch"] == "1"
    assert labels["inspect-ai/run"]
    assert await _inspect_sessions(d) == [], "sessions left after the eval"


async def test_no_sandbox_cleanup_then_cli_cleanup(
    inspect_daemon: InspectDaemon, tmp_path: Path
) -> None:
    cli = Cli(inspect_daemon, tmp_path)
    sample, printed = await cli.eval("--no-sandbox-cleanup")
    [score] = sample["scores"].values()
    session_id = score["metadata"]["session_id"]
    assert f"kept tai42 session {session_id}" in printed
    # Kept, by the run's own cleanup too: its id is the sample's session's.
    assert await _inspect_sessions(inspect_daemon) == [session_id]
    done = await cli.run("sandbox", "cleanup", "tai42")
    assert f"destroyed tai42 session {session_id}" in done.stdout
    assert await _inspect_sessions(inspect_daemon) == []
