# hivemux: the two commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_SECONDS ?= 90

.PHONY: install native demo test test-unit bench schemas proto clean

install: $(STAMP) native

# The xCUDA shim, its fake driver and test programs (native/xcuda).
native:
	$(MAKE) -C native/xcuda

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
