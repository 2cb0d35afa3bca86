# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch first (a local CPU wheel on the project's machines); another build: make TORCH="torch==2.13.0+cu128" ...
TORCH ?= torch==2.13.0

.PHONY: venv demo test test-slow lint docs figures bench data train eval clean

# the product (.) and the lab (lab/: recording, training, evaluation), both editable
$(STAMP): pyproject.toml lab/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,report,chakra,dask]' -e lab/
	touch $(STAMP)

venv: $(STAMP)

demo: venv  ## analyse the bundled 2-rank gloo DDP trace: summary, HTML report, Perfetto overlay
	$(VENV)/bin/bottleneck-oracle analyze tests/data/gloo_ddp_2rank --advise --html demo/report.html --perfetto demo/critical_path.json.gz

test: venv  ## the default (fast) test suite, as CI runs it; it builds the manual with warnings as errors (tests/test_docs.py)
	$(PY) -m pytest -q

test-slow: venv  ## slow tests only
	$(PY) -m pytest -q -m slow

lint: venv
	$(VENV)/bin/ruff check src lab/src tests benchmarks
	$(VENV)/bin/ruff format --check src lab/src tests benchmarks
	$(VENV)/bin/mypy  ## the whole package (pyproject.toml [tool.mypy]); --strict on the API: tests/test_types.py

docs: venv  ## the manual (mkdocs.yml, docs/) into site/, warnings as errors
	$(VENV)/bin/mkdocs build --strict

figures: venv  ## every figure the README and the manual quote, from the committed results (docs/figures/, the README's marked blocks)
	$(PY) benchmarks/figures.py

bench: venv  ## 1M-event benchmark against HTA and networkx (HTA in its own venv)
	$(PY) benchmarks/bench_scale.py --events 1000000 --ranks 8

data/graphs/dataset.jsonl: config.yaml | venv
	$(VENV)/bin/bottleneck-oracle generate --config config.yaml
	$(VENV)/bin/bottleneck-oracle build-dataset --config config.yaml

data: data/graphs/dataset.jsonl  ## record the bundled grid (real 2-rank runs with injected delays) and build the dataset

train: data  ## train the HeteroGAT variants and baselines, one checkpoint per split
	$(VENV)/bin/bottleneck-oracle train --config config.yaml

eval: venv  ## the table: every model and baseline per split (docs/eval.json; then make figures)
	$(VENV)/bin/bottleneck-oracle eval --checkpoint data/checkpoints --config config.yaml --json-file docs/eval.json
	$(PY) benchmarks/figures.py

clean:
	rm -rf $(VENV) demo benchmarks/out site
