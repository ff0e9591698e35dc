# d500: `make run` (set up + main job), `make test` (set up + test suite).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint browser clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all]"
	touch $(STAMP)

# Headless Chromium for the HTML leaderboard test (Debian packages).
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

run: install
	$(BIN)/d500 run

# Style: ruff's pycodestyle, pyflakes and import-order rules (pyproject.toml), pinned.
lint: install
	$(BIN)/python -m pip install --quiet -c constraints.txt ruff
	$(BIN)/ruff check d500 tests benchmarks submissions metrics

# Two passes, both always run: every test not marked `serial` on 2 workers (pytest-xdist; a test
# file per worker, so its module fixtures are built once), then the `serial` ones alone.
TEST_WORKERS ?= 2
test: install browser lint
	$(BIN)/python -m pytest -q -ra --durations=20 -n $(TEST_WORKERS) --dist loadfile -m "not serial"; \
	  first=$$?; $(BIN)/python -m pytest -q -ra --durations=10 -m serial; \
	  second=$$?; [ $$first -eq 0 ] && [ $$second -eq 0 ]

clean:
	rm -rf $(VENV) d500-results
