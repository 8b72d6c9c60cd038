# The two commands a new user needs: `make run` and `make test`. Each builds .venv from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SCENARIO ?= scenarios/quickstart.toml

.PHONY: run test test-fast lint setup clean gpu-check

$(BIN)/edgefl: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Plain torch + torchvision from the registry: a matching pair that also runs on a CPU.
	$(BIN)/pip install --quiet -e ".[dev]"
	# AutoAttack's library without its stale requests pin (pyproject.toml's autoattack extra says why)
	$(BIN)/pip install --quiet --no-deps "torchattacks>=3.5"
	touch $@

setup: $(BIN)/edgefl

run: setup
	$(BIN)/edgefl run $(SCENARIO) --out runs/quickstart --overwrite
	$(BIN)/edgefl plot runs/quickstart

# The tests spread over every core (pytest-xdist); test-fast leaves out the ones marked slow. On a
# fresh clone the round loop compiles into numba's cache (about a minute on one core) while mypy runs.
test: setup
	$(BIN)/ruff check edgefl tests bench
	$(BIN)/python -c "from edgefl.sim.round_loop import ready; ready()" & $(BIN)/mypy; typed=$$?; wait $$!; exit $$typed
	$(BIN)/pytest -n auto

test-fast: setup
	$(BIN)/pytest -n auto -m "not slow"

gpu-check: setup  # on a machine with a CUDA GPU (bench/gpu_check.sh says what it prints)
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) runs
