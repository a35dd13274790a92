"""The configuration of a tai42 sandbox in Inspect.

A task names it as the sandbox spec's config: a :class:`Tai42SandboxConfig`
object, or the path of a YAML or JSON file holding the same fields (a
relative path is relative to the directory Inspect runs the task in, the
task's own). With no config at all, a ``tai42.yaml``, ``tai42.yml`` or
``tai42.json`` beside the task is used, else the defaults.

Env values and the token are secrets: they print, repr and dump as a mask.
Inspect keeps a config object in the eval log as it dumps it, masked; a
config read back from a log with a masked secret is refused rather than
run with the mask for a value. To retry an eval whose config holds
secrets, give the config as a file (the log keeps its path) or pass the
token as ``TAI42_TOKEN``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from tai42_contract.sandbox.errors import SandboxSpecRejectedError
from tai42_contract.sandbox.models import SandboxIsolation, SandboxNetwork, SandboxSessionSpec

# The prefix of the labels this integration sets on its sessions; a
# config's own labels may not use it.
LABEL_PREFIX = "inspect-ai/"

# What pydantic prints for a SecretStr, and so what a dumped config holds.
_MASK = "**********"

CONFIG_FILES = ["tai42.yaml", "tai42.yml", "tai42.json"]
"""The files Inspect looks for beside a task that names no config."""


class Tai42SandboxConfigError(ValueError):
    """A tai42 sandbox config that cannot be used: an unreadable or
    malformed file, or fields the sandbox would refuse. The message names
    the file and the field."""


class Tai42SandboxConfig(BaseModel):
    """One sample environment's session, and how to reach the daemon.

    The session fields are those of the contract's session spec:
    ``image`` (``host``, or an image imported with ``tai42 image import``),
    ``network``, ``isolation`` (None: the provider's own), ``cpu`` and
    ``memory_mb`` (None: no cap), ``env`` (the base environment of every
    exec) and ``labels`` (added to the integration's own, which name the
    task and the sample).

    ``ttl_seconds`` is how long a session outlives its last use: every
    call through the environment keeps it alive (a touch at most once a
    minute, and before an exec whose timeout is longer than the life left),
    so a sample may run as long as it needs, and a session whose eval died
    goes away that long after. An exec whose timeout is longer than
    ``ttl_seconds`` itself may outlive its session: keep the ttl above the
    longest timeout.

    ``exec_timeout_seconds`` is the timeout of an exec Inspect runs without
    one (``timeout=None``); unset, it is ``ttl_seconds``: no shorter limit
    than the session's own life. The daemon requires a timeout on every
    exec, so there is always one.

    ``url`` and ``token`` reach the daemon; unset, they are ``TAI42_URL``
    and ``TAI42_TOKEN`` (else the client's defaults: the local daemon and
    its token file).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = "host"
    network: SandboxNetwork = "none"
    isolation: SandboxIsolation | None = None
    cpu: float | None = None
    memory_mb: int | None = None
    ttl_seconds: int = Field(default=3600, gt=0)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    token: SecretStr | None = None
    exec_timeout_seconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Tai42SandboxConfig:
        for key in self.labels:
            if key.startswith(LABEL_PREFIX):
                raise ValueError(
                    f"labels: {key!r}: the prefix {LABEL_PREFIX!r} is the integration's own"
                )
        masked = [f"env {k!r}" for k, v in self.env.items() if v.get_secret_value() == _MASK]
        if self.token is not None and self.token.get_secret_value() == _MASK:
            masked.append("token")
        if masked:
            raise ValueError(
                f"{', '.join(masked)} holds the mask {_MASK!r}, not a value: an eval log keeps "
                "secrets masked; give the config as a file, or the token as TAI42_TOKEN"
            )
        try:
            self.session_spec({})
        except SandboxSpecRejectedError as e:
            # The daemon's own rule, at load time rather than at each sample.
            raise ValueError(e.rule) from None
        return self

    def session_spec(self, labels: dict[str, str]) -> SandboxSessionSpec:
        """The session spec of one sample environment, with the
        integration's labels beside the config's."""
        return SandboxSessionSpec(
            image=self.image,
            network=self.network,
            isolation=self.isolation,
            cpu=self.cpu,
            memory_mb=self.memory_mb,
            ttl_seconds=self.ttl_seconds,
            env=dict(self.env),
            labels={**self.labels, **labels},
        )

    def default_exec_timeout(self) -> float:
        """The timeout of an exec Inspect runs with ``timeout=None``."""
        if self.exec_timeout_seconds is not None:
            return self.exec_timeout_seconds
        return float(self.ttl_seconds)


def load_config(config: BaseModel | str | None) -> Tai42SandboxConfig:
    """The config Inspect handed the sandbox: a :class:`Tai42SandboxConfig`,
    the path of a YAML or JSON file of one, or None for the defaults.

    Raises :class:`Tai42SandboxConfigError` naming the file and the field
    for a file that is missing, unreadable or malformed, or a config of
    another provider.
    """
    if config is None:
        return Tai42SandboxConfig()
    if isinstance(config, Tai42SandboxConfig):
        return config
    if isinstance(config, str):
        return _load_file(Path(config))
    raise Tai42SandboxConfigError(
        f"tai42 sandbox: a config of type {type(config).__name__} is not a Tai42SandboxConfig "
        "(nor the path of a YAML or JSON file of one)"
    )


def _load_file(path: Path) -> Tai42SandboxConfig:
    where = path if path.is_absolute() else Path(os.getcwd()) / path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Tai42SandboxConfigError(
            f"tai42 sandbox config {str(where)!r}: no such file (the config of a tai42 sandbox "
            "is the path of a YAML or JSON file, or a Tai42SandboxConfig)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise Tai42SandboxConfigError(f"tai42 sandbox config {str(where)!r}: {e}") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise Tai42SandboxConfigError(f"tai42 sandbox config {str(where)!r}: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Tai42SandboxConfigError(
            f"tai42 sandbox config {str(where)!r}: the file must hold a mapping of fields, "
            f"not a {type(data).__name__}"
        )
    try:
        return Tai42SandboxConfig.model_validate(data)
    except ValidationError as e:
        raise Tai42SandboxConfigError(f"tai42 sandbox config {str(where)!r}: {_first(e)}") from None


def _first(e: ValidationError) -> str:
    """The first problem of a validation error, as "field: message"."""
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
