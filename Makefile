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
	# The round loop compiled into numba's cache once, here at install (about a minute on one core)
	$(BIN)/python -c "from edgefl.sim.round_loop import ready; ready()"
	touch $@

setup: $(BIN)/edgefl

run: setup
	$(BIN)/edgefl run $(SCENARIO) --out runs/quickstart --overwrite
	$(BIN)/edgefl plot runs/quickstart

# The tests spread over every core (pytest-xdist); test-fast leaves out the ones marked slow. mypy
# runs beside them (its report printed after theirs): on a fresh clone it takes about a minute, which
# fits where pytest leaves a core idle while its tests wait on the processes they start.
test: setup
	$(BIN)/ruff check edgefl tests bench
	typed=$$(mktemp); $(BIN)/mypy > $$typed 2>&1 & mypy=$$!; $(BIN)/pytest -n auto; tested=$$?; \
	wait $$mypy; status=$$?; cat $$typed; rm -f $$typed; [ $$tested -eq 0 ] && [ $$status -eq 0 ]

test-fast: setup
	$(BIN)/pytest -n auto -m "not slow"

gpu-check: setup  # on a machine with a CUDA GPU (bench/gpu_check.sh says what it prints)
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) runs
