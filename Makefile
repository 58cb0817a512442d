# Two commands do all set-up on a fresh machine:  `make run` (the main job)  and  `make test`.
PYTHON ?= python3

.PHONY: setup run test test-fast gpu-test
setup:
	@# Keep the machine's torch (a GPU machine's CUDA build); on a bare CPU machine take the CPU build.
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[dev]"
	@$(PYTHON) -m ipykernel install --user --name python3 >/dev/null

run: setup
	$(PYTHON) -m harness.run $(ARGS)

test: setup
	$(PYTHON) -m pytest -q $(ARGS)

test-fast:  # the edit-test loop: no subprocess, cluster, compile or fuzz tests
	$(PYTHON) -m pytest -q -m "not slow and not gpu" $(ARGS)

gpu-test:
	$(PYTHON) -m pytest -q -m gpu $(ARGS)
