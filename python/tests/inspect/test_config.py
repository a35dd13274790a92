"""The config of the tai42 sandbox: the model, its files, and how Inspect
finds the sandbox and hands it a config. No daemon needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inspect_ai.util import SandboxEnvironmentSpec
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from pydantic import BaseModel, ValidationError

from tai42_sandbox.inspect import (
    Tai42SandboxConfig,
    Tai42SandboxConfigError,
    Tai42SandboxEnvironment,
    load_config,
)


def test_defaults() -> None:
    c = load_config(None)
    assert c == Tai42SandboxConfig()
    assert (c.image, c.network, c.ttl_seconds) == ("host", "none", 3600)
    assert c.default_exec_timeout() == 3600.0
    assert Tai42SandboxConfig(exec_timeout_seconds=90).default_exec_timeout() == 90.0


def test_session_spec_carries_every_field() -> None:
    c = Tai42SandboxConfig(
        image="debian-tools",
        network="egress",
        isolation="container",
        cpu=1.5,
        memory_mb=512,
        ttl_seconds=120,
        env={"A": "1"},
        labels={"team": "evals"},
    )
    spec = c.session_spec({"inspect-ai/task": "t"})
    assert (spec.image, spec.network, spec.isolation) == ("debian-tools", "egress", "container")
    assert (spec.cpu, spec.memory_mb, spec.ttl_seconds) == (1.5, 512, 120)
    assert spec.env["A"].get_secret_value() == "1"
    assert spec.labels == {"team": "evals", "inspect-ai/task": "t"}


def test_secrets_are_masked() -> None:
    c = Tai42SandboxConfig(env={"API_KEY": "s3cret"}, token="tok-s3cret")
    for text in (repr(c), str(c), c.model_dump_json()):
        assert "s3cret" not in text


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"network": "everywhere"}, "network"),
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"exec_timeout_seconds": -1}, "exec_timeout_seconds"),
        ({"imag": "typo"}, "imag"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"labels": {"inspect-ai/task": "x"}}, "inspect-ai/"),
        ({"image": ""}, "image"),
        ({"cpu": -1}, "cpu"),
    ],
)
def test_refused_fields(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        Tai42SandboxConfig.model_validate(fields)
    assert field in str(e.value)


def test_masked_secret_from_a_log_is_refused() -> None:
    # What a dumped config holds: a config read back from an eval log.
    dumped = json.loads(Tai42SandboxConfig(env={"K": "v"}, token="t").model_dump_json())
    assert dumped["env"]["K"] == "**********"
    with pytest.raises(ValidationError) as e:
        Tai42SandboxConfig.model_validate(dumped)
    for said in ("mask", "env 'K'", "token"):
        assert said in str(e.value)


def test_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tai42.yaml").write_text(
        "image: debian-tools\nnetwork: internal\nmemory_mb: 256\nenv:\n  GREETING: hi\n"
    )
    monkeypatch.chdir(tmp_path)  # a relative path is relative to the task's directory
    c = load_config("tai42.yaml")
    assert (c.image, c.network, c.memory_mb) == ("debian-tools", "internal", 256)
    assert c.env["GREETING"].get_secret_value() == "hi"


def test_json_file(tmp_path: Path) -> None:
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps({"image": "busybox", "ttl_seconds": 60}))
    assert load_config(str(f)) == Tai42SandboxConfig(image="busybox", ttl_seconds=60)


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    f = tmp_path / "tai42.yaml"
    f.write_text("")
    assert load_config(str(f)) == Tai42SandboxConfig()


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("missing.yaml", None, "no such file"),
        ("list.yaml", "- a\n- b\n", "mapping"),
        ("bad.json", "{", "bad.json"),
        ("bad.yaml", "image: [unclosed\n", "bad.yaml"),
        ("field.yaml", "network: everywhere\n", "network"),
        ("extra.yaml", "imagee: x\n", "imagee"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, text: str | None, said: str) -> None:
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    with pytest.raises(Tai42SandboxConfigError) as e:
        load_config(str(f))
    assert str(f) in str(e.value)
    assert said in str(e.value)


def test_other_config_type_is_refused() -> None:
    class Other(BaseModel):
        image: str = "x"

    with pytest.raises(Tai42SandboxConfigError, match="Other is not a Tai42SandboxConfig"):
        load_config(Other())


def test_registered_as_tai42() -> None:
    assert registry_find_sandboxenv("tai42") is Tai42SandboxEnvironment


def test_spec_config_deserialized_through_the_registry() -> None:
    # How Inspect reads a sandbox spec back (from a log, a CLI config).
    spec = SandboxEnvironmentSpec.model_validate(
        {"type": "tai42", "config": {"image": "debian-tools", "ttl_seconds": 30}}
    )
    assert spec.config == Tai42SandboxConfig(image="debian-tools", ttl_seconds=30)


def test_config_files_are_looked_for_beside_the_task() -> None:
    assert Tai42SandboxEnvironment.config_files() == ["tai42.yaml", "tai42.yml", "tai42.json"]
    assert not Tai42SandboxEnvironment.is_docker_compatible()
