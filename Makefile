.PHONY: install demo test test-slow lint bench bench-search typecheck gpu gpu-wheels ci

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
	python3 -m mypy trtbisect
	PYTHON=python3 bash scripts/check_trt_types.sh

# what CI runs, exactly: a fresh virtual environment, the README's two commands, the checks
ci:
	bash .ci/run

bench-search:
	python3 scripts/bench_search.py

bench:
	python3 scripts/bench.py

# the prepared GPU run (#44, docs/tensorrt.md): on the GPU machine, OUT=folder make gpu
gpu:
	bash scripts/gpu_check.sh $${OUT:-gpu_check}

# what a GPU machine without a registry needs carried (docs/tensorrt.md): onnx2torch's wheel
# in .whl/ (for the H200 image's Python 3.12), magika in .bench_cache/models/
gpu-wheels:
	python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux2014_x86_64 -d .whl onnx2torch==1.5.15
	python3 scripts/fetch_models.py magika
