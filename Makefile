# hivemux: the two commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_SECONDS ?= 90

.PHONY: install native chromium demo test test-unit bench schemas proto clean

install: $(STAMP) native chromium

# The xCUDA shim, its fake driver and test programs (native/xcuda).
native:
	$(MAKE) -C native/xcuda

# Debian's chromium, which the console's browser tests (tests/browser) drive through Playwright;
# installed only when missing (silent when it is there), with sudo unless run as root.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@test -x /usr/bin/chromium || { echo "installing Debian's chromium (browser tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Re-installs only when the project's dependency declaration changes (idempotent).
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/hivemux up --fresh --duration $(DEMO_SECONDS) --summary $(VENV)/demo-summary.json

test: install
	$(BIN)/python -m pytest -q

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

bench: install
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

schemas: install
	$(BIN)/hivemux schemas export

# Regenerate the gRPC code of the cell allocator's inspect API from its .proto.
proto: install
	cd libs && ../$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. hivemux/cells_inspect/cells_inspect.proto
	cd libs && ../$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. hivemux/salus/gate.proto

clean:
	-$(MAKE) -C native/xcuda clean
	rm -rf $(VENV) build *.egg-info libs/*.egg-info
