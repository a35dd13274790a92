# The commands CI (.ci/run) and the README use, by name. Each target is the
# command itself, nothing hidden: `make -n TARGET` prints it.
#
#   make build            the tai42 binary (./tai42)
#   make lint             golangci-lint (.golangci.yml, govet included) at zero findings
#   make test             every test and the lint, in four lanes side by side: the Go tests
#                         that need no cluster, then the crash test; the kubernetes packages'
#                         on the kubetest cluster, then the two-daemon test; the Python half,
#                         then the official MCP TypeScript SDK's client against tai42's MCP
#                         server; the lint (at a lower CPU priority)
#   make test-go          every Go test under -race (test-go-local, then test-go-kube)
#   make crash            the crash test's quick mode (5 rounds per provider)
#   make kube-daemons     the two-daemon test on the kubetest cluster (as root, about 4 minutes)
#   make ci               test: what .ci/run runs after its installs
#   make bench-run        the host runner's benchmarks (bench/run.sh, about 2.5 minutes)
#   make bench-api        the daemon API's benchmarks (bench/api.sh, about 2 minutes)
#   make bench-container  the container provider's (bench/container.sh, as root, about 10 minutes)
#   make bench-python     the Python SDK's (bench/python.sh, after python/test.sh; about 40 s)
#   make bench-mcp        an MCP tool call beside the daemon's exec (bench/mcp.sh, about a minute)
#   make bench-pull       image pulls from a loopback registry vs skopeo+umoci and docker (bench/pull.sh, as root, about 5 minutes)
#   make bench-kubernetes the kubernetes provider's on the harness cluster, vs kubectl and the container provider (bench/kubernetes.sh, as root; the cluster's first build about 6 minutes)
#   make fmt              gofmt -w on the tree
#
# Namespaces, mounts and cgroups need root: as another user the tests that
# need them skip and say why; CI runs as root, so nothing is skipped there.

GO ?= go
# The GOGC of the builds (the go command's compiler, golangci-lint): a
# fifth less CPU than Go's default of 100, for more memory
# (internal/buildtest.BuildGOGC says how it was measured). Not the tests'.
BUILD_GOGC = 400
# golangci-lint from the module proxy at a pinned version; `go run` builds it
# once (about 1.5 minutes with its download, on 2 cores) and reuses the
# build from Go's cache after that (about 2 s to start).
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

# The targets run one after another, in the order written, even under -j:
# the tests and the crash test share the machine's namespaces and cores
# (test-kube-python runs its two halves side by side itself).
.NOTPARALLEL:

# The packages whose tests run on the kubetest cluster (each test binary
# starts one; provider/kubernetes/kubetest): they wait on the cluster, not
# on the CPU. Its binaries are built first, as root (the tests need root
# and skip without it), outside any test's timeout: cold, minutes; warm,
# or built meanwhile by another process (.ci/run's, in the background),
# which it waits for, a moment.
KUBE_PKGS = ./provider/kubernetes/... ./bench/kubernetes/
KUBE_BUILD = if [ "$$(id -u)" = 0 ]; then GOGC=$(BUILD_GOGC) $(GO) run ./provider/kubernetes/kubetest/cmd/kubecluster build; fi

.PHONY: build lint test test-go test-go-local test-go-kube test-python test-mcp-node crash kube-daemons kube-binaries ci bench-run bench-api bench-container bench-python bench-mcp bench-pull bench-kubernetes fmt

build:
	$(GO) build -o tai42 ./cmd/tai42
	CGO_ENABLED=0 $(GO) build -o tai42-agent ./cmd/tai42-agent

# golangci-lint's govet runs go vet's own analyzers (and go test runs vet's
# high-confidence subset on every test package), so there is no separate
# go vet run: cold, it compiled the whole tree once more. Its staticcheck
# is staticcheck v0.8.2 with its own default checks, so there is no
# separate staticcheck run either. The crash test's files (tag crash) are
# linted too (.golangci.yml's build-tags).
# NICE runs the lint at a lower CPU priority when set (make test sets it).
lint:
	GOGC=$(BUILD_GOGC) $(NICE) $(GOLANGCI_LINT) run ./...

# Every test and the lint, in four lanes side by side: the Go tests that
# need no cluster, then the crash test; the kubernetes packages' (on the
# kubetest cluster, its binaries built first), then the two-daemon test;
# the Python half, then the MCP TypeScript client's test; the lint. On a
# cold machine they are minutes of compiling each, and then mostly waiting
# (on sessions, Pods, daemons): side by side, one lane's waiting is
# another's CPU. The lint yields the
# CPU to the others (nice): its result is needed only at the end, the
# cluster's binaries (built meanwhile by .ci/run) are needed first. The
# Python half waits for those binaries too (kube-binaries): its clauses
# that time the CPU (a cap's throttling) cannot tell anything while the
# cluster's build fills both cores. The first lane's output streams; the
# others' are kept in files and printed once every lane is done; any lane
# failing fails it.
test:
	@$(LANES) "test-go-local crash" "test-go-kube kube-daemons" "kube-binaries test-python test-mcp-node" "lint NICE=nice"

# LANES A B...: make -k of each list of targets, in order, the lists side
# by side; the summary says how long each lane took.
LANES = sh -c 'dir=$$(mktemp -d); n=0; \
	for lane in "$$@"; do n=$$((n + 1)); [ $$n -eq 1 ] && continue; \
		echo "lane $$n ($$lane) > $$dir/$$n, printed below once done"; \
		{ s=$$(date +%s); $(MAKE) --no-print-directory -k $$lane >"$$dir/$$n" 2>&1; echo $$? >"$$dir/$$n.rc"; \
			echo $$(($$(date +%s) - s)) >"$$dir/$$n.time"; } & done; \
	s=$$(date +%s); one=0; $(MAKE) --no-print-directory -k $$1 || one=$$?; t=$$(($$(date +%s) - s)); wait; \
	status=$$one; summary="lane 1 ($$1): exit $$one in $$t s"; \
	for i in $$(seq 2 $$n); do rc=$$(cat "$$dir/$$i.rc"); t=$$(cat "$$dir/$$i.time"); \
		echo "--- lane $$i, exit $$rc, $$t s:"; cat "$$dir/$$i"; \
		summary="$$summary; lane $$i: exit $$rc in $$t s"; [ "$$rc" = 0 ] || status=1; done; \
	rm -rf "$$dir"; echo "--- $$summary"; exit $$status' lanes

test-go: test-go-local test-go-kube

# The container provider's package first: it is the longest (15 min of
# stop 31's 31 min CI, measured with go test -json), and go test starts
# packages in the order given, so that listed with the rest it started
# 14 min in, last, with the machine idle beside it at the end. Started
# first it runs beside every other lane's busiest minutes: 20 min was
# not enough for it there (its tests passed until the timeout ended
# them), hence -timeout 40m, which bounds a hang, not the run.
test-go-local:
	$(GO) test -race -count=1 -timeout 40m ./provider/container/ $$($(GO) list ./... | grep -v -e /provider/kubernetes -e /bench/kubernetes -e '/provider/container$$')

# -timeout 40m: the packages' test binaries start side by side and then
# take the machine's one cluster in turn (kubetest's lock), each waiting
# meanwhile on its own clock: kubetest's waited 13-18 min in CI (its
# tests then took 5), and 20 min ended it once.
test-go-kube:
	$(KUBE_BUILD)
	$(GO) test -race -count=1 -timeout 40m $(KUBE_PKGS)

# python/test.sh makes python/.venv and installs the Python distribution
# with its test extras from PyPI itself.
# kube-binaries: the kubetest cluster's binaries, built or waited for (as
# root; nothing otherwise).
kube-binaries:
	$(KUBE_BUILD)

test-python:
	python/test.sh

# The official MCP TypeScript SDK's client (from npm, at the version
# mcpserver/clients/node/package-lock.json pins) driving "tai42 mcp" and a
# daemon's /mcp; the Python SDK's client is in python/test.sh's tests.
test-mcp-node:
	mcpserver/clients/node/test.sh

# The crash test (build tag crash, so not in test-go): "tai42 serve" killed
# with SIGKILL under load and restarted on its state directory, for the host
# and container providers, 5 rounds each. The full mode is
#   go test -race -tags crash -count=1 -timeout 30m -run TestCrash ./cmd/tai42/ -crash.rounds 50
crash:
	$(GO) test -race -tags crash -count=1 -timeout 15m -run TestCrash ./cmd/tai42/

# Two "tai42 serve --provider kubernetes" on one namespace of the kubetest
# cluster (cmd/tai42/kube_daemons_test.go; opt-in, since it starts a
# cluster of its own after the provider's tests have had theirs).
kube-daemons:
	$(KUBE_BUILD)
	TAI42_KUBETEST=1 $(GO) test -race -count=1 -timeout 30m -run TestKubeDaemons ./cmd/tai42/

ci: test

bench-run:
	bash bench/run.sh

bench-api:
	bash bench/api.sh

bench-container:
	bash bench/container.sh

bench-python:
	bash bench/python.sh

bench-mcp:
	bash bench/mcp.sh

bench-pull:
	bash bench/pull.sh

bench-kubernetes:
	bash bench/kubernetes.sh

fmt:
	gofmt -w $$(git ls-files '*.go')
