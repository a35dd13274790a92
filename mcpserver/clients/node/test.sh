#!/usr/bin/env bash
# The official MCP TypeScript SDK's client (@modelcontextprotocol/sdk, the
# version package-lock.json pins, from npm) driving tai42's MCP server over
# stdio and Streamable HTTP against a real daemon (test.mjs), on a tai42
# built here.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "$0: needs Node.js 20 or later with npm (node --test)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
# One build of tai42 at a time on the machine, as python/test.sh does.
flock "${TMPDIR:-/tmp}/tai42-build.lock" env GOGC=400 go build -o "$tmp/tai42" ../../../cmd/tai42
TAI42_BIN="$tmp/tai42" node --test --test-concurrency=1 test.mjs
