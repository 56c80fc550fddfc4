# ctxlens: `make run` serves the dashboard, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: run serve static test install install-test chromium migrate bench fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,scale]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

migrate: install
	$(BIN)/python manage.py migrate --no-input

# Hashed, compressed copies of static/ in var/staticfiles, which the app serves (WhiteNoise).
static: install
	$(BIN)/python manage.py collectstatic --no-input --verbosity 0

# Serve HTTP and websockets on one port with uvicorn (measured faster than daphne for large
# OTLP bodies; `daphne config.asgi:application` works as well). DEBUG is off unless DEBUG=1;
# static files come from var/staticfiles (`make static`). With CTXLENS_OTLP_GRPC_PORT set,
# OTLP/gRPC ingest runs beside it on that port and stops with it. Websocket messages are not
# compressed: each is a few hundred bytes of JSON, and deflating it once per open page cost about
# 8 % of the server's CPU with 200 pages open (bench/live.py, py-spy).
run: migrate static
	$(BIN)/python manage.py bootstrap
	@if [ "$${CTXLENS_OTLP_GRPC_PORT:-0}" != "0" ]; then \
		$(BIN)/python manage.py serve_otlp_grpc --host $(HOST) & grpc=$$!; \
		trap 'kill $$grpc 2>/dev/null' EXIT INT TERM; \
	fi; \
	$(BIN)/uvicorn config.asgi:application --host $(HOST) --port $(PORT) --lifespan off --ws-per-message-deflate false --log-level warning

serve: static
	$(BIN)/uvicorn config.asgi:application --host $(HOST) --port $(PORT) --lifespan off --ws-per-message-deflate false --log-level warning

# Browser tests drive Debian's chromium; install it when it is missing.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "Installing Debian's chromium for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

test: install-test chromium
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-test
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The long OTLP fuzz run (the suite runs a short one): decoders, normaliser, store.
FUZZ_EXAMPLES ?= 5000
fuzz: install-test
	$(BIN)/python bench/fuzz_otlp.py --examples $(FUZZ_EXAMPLES)

clean:
	rm -rf $(VENV) var/test-*.sqlite3*
