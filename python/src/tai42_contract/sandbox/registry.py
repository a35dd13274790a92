"""The registry facet: providers register by name, consumers acquire one
through the one chokepoint, :func:`require_sandbox`, which raises
:class:`SandboxUnavailableError` when no provider backs the seam."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, overload

from .base import Sandbox
from .errors import SandboxUnavailableError

SandboxFactory = Callable[[], Sandbox]
_F = TypeVar("_F", bound=Callable[[], Sandbox])


class SandboxRegistry:
    """Provider names mapped to sandboxes, or to factories made into one on
    first use. Safe for use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Sandbox | SandboxFactory] = {}

    def register(self, name: str, provider: Sandbox | SandboxFactory) -> None:
        """Register provider (a Sandbox, or a callable making one) under
        name. A name is registered once; again is a ValueError."""
        if not name:
            raise ValueError("a sandbox provider needs a name")
        with self._lock:
            if name in self._entries:
                raise ValueError(f"sandbox provider {name!r} is already registered")
            self._entries[name] = provider

    def unregister(self, name: str) -> bool:
        """Remove name; report whether it was registered."""
        with self._lock:
            return self._entries.pop(name, None) is not None

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        with self._lock:
            return list(self._entries)

    def require(self, name: str | None = None) -> Sandbox:
        """The sandbox registered under name, or without one the first
        registered; SandboxUnavailableError when there is none."""
        with self._lock:
            if not name:
                if not self._entries:
                    raise SandboxUnavailableError()
                name = next(iter(self._entries))
            entry = self._entries.get(name)
            if entry is None:
                raise SandboxUnavailableError(name, list(self._entries))
            if not isinstance(entry, Sandbox):
                entry = entry()
                if not isinstance(entry, Sandbox):
                    raise TypeError(f"sandbox provider {name!r}: the factory made no Sandbox")
                self._entries[name] = entry
            return entry


_default = SandboxRegistry()


@overload
def register_sandbox(provider: _F, /) -> _F: ...
@overload
def register_sandbox(*, name: str) -> Callable[[_F], _F]: ...
@overload
def register_sandbox(provider: Sandbox, /, *, name: str) -> Sandbox: ...
def register_sandbox(
    provider: Sandbox | _F | None = None, /, *, name: str | None = None
) -> Sandbox | _F | Callable[[_F], _F]:
    """Register a provider in the process-wide registry.

    As a decorator on a Sandbox subclass (or a zero-argument factory) it
    registers it under ``name``, by default its ``__name__``, to be made on
    first :func:`require_sandbox`, and returns it unchanged::

        @register_sandbox(name="mine")
        class MySandbox(Sandbox): ...

    Called with a Sandbox instance it registers that instance under name.
    """
    if provider is None:
        if name is None:
            raise TypeError("register_sandbox() needs a provider or a name")
        given = name

        def deco(factory: _F) -> _F:
            _default.register(given, factory)
            return factory

        return deco
    if isinstance(provider, Sandbox):
        if not name:
            raise TypeError("registering a Sandbox instance needs a name")
        _default.register(name, provider)
        return provider
    _default.register(name or str(getattr(provider, "__name__", "")), provider)
    return provider


def unregister_sandbox(name: str) -> bool:
    """Remove name from the process-wide registry; report whether it was
    there."""
    return _default.unregister(name)


def require_sandbox(name: str | None = None) -> Sandbox:
    """The acquisition chokepoint: the provider registered under name (or
    the first registered), else SandboxUnavailableError."""
    return _default.require(name)


def registered_sandboxes() -> list[str]:
    """The names in the process-wide registry, in registration order."""
    return _default.names()


__all__ = [
    "SandboxFactory",
    "SandboxRegistry",
    "register_sandbox",
    "registered_sandboxes",
    "require_sandbox",
    "unregister_sandbox",
]
