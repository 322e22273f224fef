# The two commands a fresh clone needs:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO_OUT ?= demo-report
# our sources' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (some sandboxes and CI images),
# Python would otherwise compile every module again on every command (~0.1 s of a 0.7 s simulate)
COMPILE := $(PY) -m compileall -q clustersim simulator schedules topologies traces

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,collect,sweep]'
	$(COMPILE)
	touch $(STAMP)

venv: $(STAMP)

# Flagship: Llama-3-70B on 1,024 H100s (TP8+SP x PP8 x DP16, interleaved 1F1B, selective recompute), flow network.
demo: $(STAMP)
	$(COMPILE)
	$(VENV)/bin/clustersim simulate --cluster dgx-h100 --gpus 1024 --model llama3-70b \
	  --tp 8 --pp 8 --dp 16 --seq 8192 --global-batch 1024 --micro-batch 1 \
	  --sp --recompute selective --schedule interleaved --virtual-stages 2 --network flow --out $(DEMO_OUT)

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .hypothesis
