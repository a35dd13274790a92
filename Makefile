# The commands CI (.ci/run) and the README use, by name. Each target is the
# command itself, nothing hidden: `make -n TARGET` prints it.
#
#   make build            the tai42 binary (./tai42)
#   make lint             go vet, then golangci-lint (.golangci.yml) at zero findings
#   make test             lint, then every Go test under -race, then the Python half
#   make crash            the crash test's quick mode (5 rounds per provider)
#   make kube-daemons     the two-daemon test on the kubetest cluster (as root, about 5 minutes)
#   make ci               test, crash, then kube-daemons: what .ci/run runs after its installs
#   make bench-run        the host runner's benchmarks (bench/run.sh, about 2.5 minutes)
#   make bench-api        the daemon API's benchmarks (bench/api.sh, about 2 minutes)
#   make bench-container  the container provider's (bench/container.sh, as root, about 10 minutes)
#   make bench-python     the Python SDK's (bench/python.sh, after python/test.sh; about 40 s)
#   make bench-pull       image pulls from a loopback registry vs skopeo+umoci and docker (bench/pull.sh, as root, about 5 minutes)
#   make bench-kubernetes the kubernetes provider's on the harness cluster, vs kubectl and the container provider (bench/kubernetes.sh, as root; the cluster's first build about 6 minutes)
#   make fmt              gofmt -w on the tree
#
# Namespaces, mounts and cgroups need root: as another user the tests that
# need them skip and say why; CI runs as root, so nothing is skipped there.

GO ?= go
# golangci-lint from the module proxy at a pinned version; `go run` builds it
# once (about 1.5 minutes with its download, on 2 cores) and reuses the
# build from Go's cache after that (about 2 s to start).
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

# The targets run one after another, in the order written, even under -j:
# the tests and the crash test share the machine's namespaces and cores.
.NOTPARALLEL:

.PHONY: build lint test test-go test-python crash kube-daemons ci bench-run bench-api bench-container bench-python bench-pull bench-kubernetes fmt

build:
	$(GO) build -o tai42 ./cmd/tai42

# go vet stays beside golangci-lint's govet: it is the toolchain's own set of
# checks, and it runs in seconds. golangci-lint's staticcheck is
# staticcheck v0.8.2 with its own default checks, so there is no separate
# staticcheck run. The crash test's files (tag crash) are linted by both.
lint:
	$(GO) vet ./...
	$(GO) vet -tags crash ./cmd/tai42/
	$(GOLANGCI_LINT) run ./...

test: lint test-go test-python

test-go:
	$(GO) test -race -count=1 -timeout 20m ./...

# python/test.sh makes python/.venv and installs the Python distribution
# with its test extras from PyPI itself.
test-python:
	python/test.sh

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
	TAI42_KUBETEST=1 $(GO) test -race -count=1 -timeout 30m -run TestKubeDaemons ./cmd/tai42/

ci: test crash kube-daemons

bench-run:
	bash bench/run.sh

bench-api:
	bash bench/api.sh

bench-container:
	bash bench/container.sh

bench-python:
	bash bench/python.sh

bench-pull:
	bash bench/pull.sh

bench-kubernetes:
	bash bench/kubernetes.sh

fmt:
	gofmt -w $$(git ls-files '*.go')
