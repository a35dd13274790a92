#!/usr/bin/env bash
# The Python half of the README's test command. It makes python/.venv (once),
# installs the distribution with its test and inspect extras from PyPI,
# checks that a wheel builds and installs into a clean venv with and without
# [inspect], then runs the lint (ruff), the type check (mypy --strict) and
# the tests (typed too), which start real tai42 daemons (host, and container as root
# with runc or crun) from a tai42 built here.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[inspect,test]'

# The distribution as a user gets it: a wheel, installed into a venv of its
# own, importable with its Inspect entry point.
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps . -w "$tmp/dist"
wheel=$(ls "$tmp"/dist/tai42_sandbox-*.whl)
"$py" -m venv "$tmp/clean"
"$tmp/clean/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
"$tmp/clean/bin/python" -c 'import tai42_sandbox, tai42_contract.sandbox'
"$tmp/clean/bin/python" -m pip install -q --disable-pip-version-check "$wheel[inspect]"
"$tmp/clean/bin/python" - <<'PY'
from importlib.metadata import entry_points
import tai42_sandbox.inspect
assert any(ep.name == "tai42_sandbox" or ep.value.startswith("tai42_sandbox")
           for ep in entry_points(group="inspect_ai")), "no inspect_ai entry point"
PY

# One build of tai42 at a time on the machine: the Go tests' builds take
# the same lock (internal/buildtest), so that builds running side by side
# share one compile through Go's build cache instead of each compiling the
# tree.
# GOGC=400: the compiler's, as the Go tests' builds run it (a fifth less
# CPU, for more memory; not part of the build cache's keys).
flock "${TMPDIR:-/tmp}/tai42-build.lock" env GOGC=400 go build -o "$tmp/tai42" ../cmd/tai42
export TAI42_BIN="$tmp/tai42"
.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/mypy tests
# -rs: every skip's reason in the summary (CI skips nothing it can run).
.venv/bin/python -m pytest -q -rs -p no:cacheprovider "$@"
