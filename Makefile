# hivemux: the two commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_SECONDS ?= 90

.PHONY: install native chromium demo test test-unit bench schemas proto lock clean

install: $(STAMP) native chromium

# The xCUDA shim, its fake driver and test programs (native/xcuda), and the CPU devices mode's
# fake NVML (`hivemux up --executor process` without GPUs: libs/hivemux/executor/cpu_devices).
native:
	@$(MAKE) -s --no-print-directory -C native/xcuda
	@$(MAKE) -s --no-print-directory -C libs/hivemux/executor/cpu_devices

# Debian's chromium, which the console's browser tests (tests/browser) drive through Playwright;
# installed only when missing (silent when it is there), with sudo unless run as root.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@test -x /usr/bin/chromium || { echo "installing Debian's chromium (browser tests)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Installs exactly the lock (versions and hashes; `make lock` regenerates it), then the project
# itself against it (no build isolation: the locked setuptools builds it). Re-installs only when
# the lock or the project's declaration changes (idempotent). pip's own chatter goes to a log,
# shown only when something fails.
INSTALL_LOG := $(VENV)/install.log
$(STAMP): pyproject.toml setup.py requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing requirements.lock into $(VENV) (log: $(INSTALL_LOG))"
	@$(BIN)/python -m pip install --require-hashes -r requirements.lock >$(INSTALL_LOG) 2>&1 \
	  || { tail -n 40 $(INSTALL_LOG); echo "make install: pip failed (whole log: $(INSTALL_LOG))"; exit 1; }
	@$(BIN)/python -m pip install --no-deps --no-build-isolation -e . >>$(INSTALL_LOG) 2>&1 \
	  || { tail -n 40 $(INSTALL_LOG); echo "make install: installing the project failed (whole log: $(INSTALL_LOG))"; exit 1; }
	@touch $(STAMP)

# Regenerate requirements.lock from pyproject.toml (the project and its `test` extra): exact
# versions and every file's sha256, resolved for this Python by uv (pinned, in a venv of its own).
# The torch CPU build comes from the machine's wheel folder (PIP_FIND_LINKS, /opt/wheels).
UV_VERSION := 0.13.10
LOCK_TOOLS := $(VENV)/lock-tools
lock:
	@test -x $(LOCK_TOOLS)/bin/uv || { $(PYTHON) -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/python -m pip install --quiet uv==$(UV_VERSION); }
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --find-links $${PIP_FIND_LINKS:-/opt/wheels} --custom-compile-command 'make lock' -o requirements.lock

demo: install
	$(BIN)/hivemux up --fresh --duration $(DEMO_SECONDS) --summary $(VENV)/demo-summary.json

# The suite waits on brokers, databases and processes more than it computes: TEST_WORKERS
# workers (pytest-xdist), each with its own embedded broker and database, a test file per worker
# at a time (its module fixtures are set up once), at most two end-to-end files at once
# (tests/e2e/conftest.py). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: install
	$(PYTEST)

test-unit: install
	$(PYTEST) tests/unit

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
	-$(MAKE) -C libs/hivemux/executor/cpu_devices clean
	rm -rf $(VENV) build *.egg-info libs/*.egg-info
