.PHONY: install demo test test-slow lint bench bench-search typecheck

install:
	python3 -m pip install -e ".[torch,dev,report]"

demo:
	trtbisect run models/demo.onnx --inputs models/demo_inputs.npz --out runs/demo

test:
	python3 -m pytest -q

test-slow:
	python3 -m pytest -q --runslow

lint:
	ruff check trtbisect tests scripts

typecheck:
	PYTHON=python3 bash scripts/check_trt_types.sh

bench-search:
	python3 scripts/bench_search.py

bench:
	python3 scripts/bench.py
