# mlmkit: `make train` (quick start) and `make test` set everything up on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# PyTorch build. On Linux without an NVIDIA driver a CPU-only build is taken (about
# 200 MB instead of several GB of CUDA libraries) from PyTorch's CPU index or a local
# wheel; elsewhere the default build from PyPI. Override, e.g.: make test TORCH=torch==2.6.0
HAS_NVIDIA := $(shell command -v nvidia-smi 2>/dev/null)
UNAME_S    := $(shell uname -s)
ifeq ($(UNAME_S)$(HAS_NVIDIA),Linux)
TORCH       ?= torch==2.13.0+cpu
TORCH_INDEX ?= --extra-index-url https://download.pytorch.org/whl/cpu
else
TORCH       ?= torch>=2.11
TORCH_INDEX ?=
endif

ARGS ?=

# The GPU image's Python, for make floor-env: python3.12 on the PATH, else pyenv's
PYTHON_312 ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),$(shell $(p) -c 'import sys; print(sys.executable)' 2>/dev/null)))
FLOOR  ?= .venv-floor
WHEELS ?= .whl
WHEELS_NEWEST ?= .whl-newest

.PHONY: venv slurm floor-env gpu-rehearsal test-floor train test test-long test-fast lint bench bench-quality bench-modern bench-phases bench-gpu gpu-wheels gpu-check bench-scaling bench-head bench-checkpointing bench-continue bench-kernels bench-masking bench-processes bench-vocab-init eval plot finetune sweep-table bench-data bench-data-memory bench-stream-resume tokenizer clean

venv: $(STAMP)

# torch alone first (only it is looked up on the extra index); then mlmkit, torch's dependencies
# and the dev tools through uv, which downloads and installs in parallel (about 45 s instead of
# 90 s on 2 cores, bytecode included, which an environment with PYTHONDONTWRITEBYTECODE=1 would
# otherwise compile in every process) and keeps that torch; pip where uv cannot be installed or
# cannot reach the index (uv does not read pip.conf).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/python -m pip install --quiet --retries 1 --no-deps "$(TORCH)" $(TORCH_INDEX)
	( $(BIN)/python -m pip install --quiet uv && \
	  $(BIN)/python -m uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[dev]" ) || \
	  $(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# SLURM for the real-cluster tests (tests/slurm/: munged, slurmctld and two slurmd on this
# machine): Debian's slurm-wlm and munge, installed where the machine allows it (root and
# apt-get); elsewhere it says why and does nothing, and those tests skip (fail under CI=true).
SLURM_PACKAGES ?= slurm-wlm munge

slurm:  ## install SLURM and munge for tests/slurm/ (Debian, as root; about 20 s)
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then \
	  echo "slurm: slurmctld, slurmd and munged are installed"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "slurm: not installed: installing $(SLURM_PACKAGES) needs root (tests/slurm/ will skip)"; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "slurm: not installed: no apt-get here; install $(SLURM_PACKAGES) (tests/slurm/ will skip)"; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null; } || \
	  echo "slurm: apt-get could not install $(SLURM_PACKAGES) (tests/slurm/ will skip)"; \
	fi

# The quick start: at most QUICK_START_TIME of training (its schedule decays over that budget),
# so it ends within 6 minutes on any CPU, and a 4,096-token WordPiece vocabulary, which suits
# the 1.7 MB built-in corpus and halves the embeddings' and the head's work (README, "The
# quick start"). make train QUICK_START_TIME=10m for longer.
QUICK_START_TIME ?= 5m
QUICK_START_VOCAB ?= 4096

train: venv  ## quick start: bert-tiny on the built-in corpus for 5 minutes
	$(BIN)/python train.py train.max_time=$(QUICK_START_TIME) tokenizer.vocab_size=$(QUICK_START_VOCAB) $(ARGS)

eval: venv  ## MLM figures of a model: make eval ARGS="checkpoint=outputs/<run>"
	$(BIN)/python -m mlmkit eval $(ARGS)

finetune: venv  ## GLUE fine-tuning: make finetune ARGS="checkpoint=outputs/<run> task=sst2 task.data_dir=../shared/data/glue/SST-2"
	$(BIN)/python -m mlmkit finetune $(ARGS)

plot: venv  ## curves of runs: make plot ARGS="outputs/<run> [more runs] [--out file.png]"
	$(BIN)/python -m mlmkit plot $(ARGS)

sweep-table: venv  ## final figures of a sweep: make sweep-table ARGS="multirun/<date>/<time>"
	$(BIN)/python -m mlmkit sweep $(ARGS)

# Test files run in TEST_WORKERS processes at once (pytest-xdist; much of a test's time is a
# subprocess starting Python and importing torch, which one core does alone), each with
# TEST_THREADS threads (more threads than cores make OpenMP's waiting threads spin), the longest
# files first (tests/conftest.py; --no-loadscope-reorder keeps xdist from putting the files with
# the most tests first instead).
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
# make test LONG=1: the long tests (make test-long) too, among the others in the same workers, so
# that the other worker goes on while they train (what CI runs)
ifeq ($(LONG),1)
TEST_MARKS := -m "long or not long"
endif

# Bytecode of mlmkit and the tests first: where PYTHONDONTWRITEBYTECODE=1 is set, every fresh
# interpreter a test starts would compile them again. A file that does not compile is printed,
# and pytest reports it too.
test: venv  ## the test suite (CPU, a few minutes)
	$(BIN)/python -m compileall -q src tests || true
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=12 $(TEST_MARKS) $(ARGS)

test-long: venv  ## the long tests alone (300 steps of bert-mini that must learn word order a random init lacks; docs/benchmarks.md)
	$(BIN)/python -m compileall -q src tests || true
	$(BIN)/python -m pytest -q --durations=5 -m long $(ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

bench: venv  ## Trainer (fp32; bf16 where the CPU has bf16 hardware) vs mlmkit: tokens/s, ratios, MFU
	$(BIN)/python benchmarks/trainer_vs_mlmkit.py $(ARGS)

bench-quality: venv  ## time to quality, Trainer vs mlmkit in the same budget: make bench-quality ARGS="--budget 300 --preset bert-mini"
	$(BIN)/python benchmarks/quality.py $(ARGS)

bench-modern: venv  ## bert-mini vs modernbert-mini, document isolation, linear vs WSD: held-out loss at equal wall-clock (make bench-modern ARGS="--budget 60")
	$(BIN)/python benchmarks/modern.py $(ARGS)

bench-phases: venv  ## phases at equal tokens: bert-mini at 128, 90/10 128->512, 512; a ModernBERT context extension (held-out loss at 128 and 512/1024 tokens)
	$(BIN)/python benchmarks/phases.py $(ARGS)

bench-gpu: venv  ## bert-base seq 128 bf16, mlmkit vs Trainer on a CUDA GPU (ARGS=--tiny on a CPU)
	$(BIN)/python benchmarks/gpu.py $(ARGS)

# Two sets of what a bare GPU image lacks: the floor set (mlmkit's lowest declared versions,
# .ci/gpu-carry.txt) into .whl/ and the newest releases (.ci/gpu-carry-newest.txt) into
# .whl-newest/; the GPU check's rehearsal runs with each.
gpu-wheels: $(WHEELS)/.fetched $(WHEELS_NEWEST)/.fetched  ## the wheels a bare GPU image lacks, into .whl/ and .whl-newest/ (needs PyPI; docs/benchmarks.md, The GPU check)

$(WHEELS)/.fetched: .ci/gpu-carry.txt | venv
	rm -rf $(WHEELS) && $(BIN)/python benchmarks/gpu_check.py wheels --list .ci/gpu-carry.txt --dest $(WHEELS)
	touch $@

$(WHEELS_NEWEST)/.fetched: .ci/gpu-carry-newest.txt | venv
	rm -rf $(WHEELS_NEWEST) && $(BIN)/python benchmarks/gpu_check.py wheels --list .ci/gpu-carry-newest.txt --dest $(WHEELS_NEWEST)
	touch $@

# On a GPU machine (no package index there: no venv, nothing installed first), from the root:
#   python3 benchmarks/gpu_check.py run --wheels .whl --out gpu-check
gpu-check:  ## the GPU check in this Python: GPU tests, mlmkit doctor, bert-base vs Trainer, modernbert-base
	$(PYTHON) benchmarks/gpu_check.py run --out gpu-check $(ARGS)

# The GPU image's Python and versions (.ci/gpu-image.txt: what it holds that mlmkit and the
# libraries it uses import or probe for, torchvision and torchaudio among them), bare as the image
# is: the GPU check's CPU rehearsal runs there with each set of carried wheels (make test), and so
# do mlmkit's lowest declared versions. About 5.6 GB (torch's CUDA build, the only one of 2.11 on
# PyPI; it runs on a CPU too), about 30 s through uv from its cache. Bytecode is written only for
# what its processes import (the first import below, then the tests'), not for all of torch: 27 s
# of CPU instead of 66.
FLOOR_WARM = import torch, transformers, accelerate; from transformers import BertForMaskedLM, ModernBertForMaskedLM
floor-env: $(FLOOR)/.installed

$(FLOOR)/.installed: .ci/gpu-image.txt | venv
	@test -n "$(PYTHON_312)" || { echo "make floor-env needs Python 3.12 (the GPU image's): set PYTHON_312"; exit 1; }
	rm -rf $(FLOOR) && $(PYTHON_312) -m venv $(FLOOR)
	$(BIN)/python -m uv pip install --quiet --python $(FLOOR)/bin/python -r .ci/gpu-image.txt || \
	  $(FLOOR)/bin/python -m pip install --quiet -r .ci/gpu-image.txt
	PYTHONDONTWRITEBYTECODE= $(FLOOR)/bin/python -c "$(FLOOR_WARM)"
	touch $@

gpu-rehearsal: floor-env gpu-wheels  ## the GPU check's CPU mode, as a bare GPU image runs it, with each wheel set
	$(FLOOR)/bin/python benchmarks/gpu_check.py run --cpu --wheels $(WHEELS) --out gpu-check-cpu
	$(FLOOR)/bin/python benchmarks/gpu_check.py run --cpu --wheels $(WHEELS_NEWEST) --out gpu-check-cpu-newest

# The library's own tests (not the end-to-end runs) at the lowest versions mlmkit declares: the
# floor environment with the carried wheels and this checkout installed beside it, as on the GPU.
FLOOR_TESTS ?= tests/config tests/masking tests/model tests/training tests/data/test_tokenizer.py tests/data/test_vocab.py tests/data/test_loader.py
test-floor: floor-env gpu-wheels  ## the unit tests at the lowest declared versions (CI runs it)
	rm -rf $(FLOOR)/site && $(FLOOR)/bin/python benchmarks/gpu_check.py install --wheels $(WHEELS) --site $(FLOOR)/site >/dev/null
	PYTHONDONTWRITEBYTECODE= PYTHONPATH=$(FLOOR)/site OMP_NUM_THREADS=$(TEST_THREADS) $(FLOOR)/bin/python -m pytest -q -n $(TEST_WORKERS) -m "not slow" -p no:cacheprovider $(FLOOR_TESTS) $(ARGS)

bench-scaling: venv  ## tokens/s as sequence length and model size grow (a Markdown table)
	$(BIN)/python benchmarks/scaling.py $(ARGS)

bench-head: venv  ## sparse vs full MLM head, tokens/s side by side
	$(BIN)/python benchmarks/sparse_head.py $(ARGS)

bench-checkpointing: venv  ## gradient checkpointing on vs off at long contexts: peak memory and tokens/s side by side
	$(BIN)/python benchmarks/gradient_checkpointing.py $(ARGS)

bench-continue: venv  ## continued pretraining per family: run_mlm's Trainer vs mlmkit train model.init_from at equal wall-clock
	$(BIN)/python benchmarks/continue_vs_run_mlm.py $(ARGS)

bench-kernels: venv  ## mlmkit's CPU kernels (head loss, bf16 attention) vs the plain torch ops
	$(BIN)/python benchmarks/cpu_kernels.py $(ARGS)

bench-masking: venv  ## masking strategies vs transformers' collator, batches/s side by side
	$(BIN)/python benchmarks/masking.py $(ARGS)

bench-data: venv  ## tokenize+pack speed, run_mlm's way vs mlmkit, MB/s side by side
	$(BIN)/python benchmarks/data_speed.py $(ARGS)

bench-data-memory: venv  ## peak RSS: map mode on 200 MB, streaming on growing corpora
	$(BIN)/python benchmarks/data_memory.py $(ARGS)

bench-stream-resume: venv  ## streaming: time to resume at 10% and 90% of 200 MB, the shards' reading cost
	$(BIN)/python benchmarks/stream_resume.py $(ARGS)

tokenizer: venv  ## train a tokenizer, e.g. make tokenizer ARGS="data=files data.train_files=[a.txt] tokenizer.algorithm=bpe out=tok/"
	$(BIN)/python -m mlmkit tokenizer $(ARGS)

bench-processes: venv  ## tokens/s of 1 against 2 processes, scaling efficiency
	$(BIN)/python benchmarks/process_scaling.py $(ARGS)

bench-vocab-init: venv  ## tokenizer.extend_vocab on the Hindi novel: words the old vocabulary cannot spell started as the average word vs [UNK], early losses side by side
	$(BIN)/python benchmarks/vocab_init.py $(ARGS)

lint: venv  ## ruff: the rules of pyproject.toml (lines within 100 characters, docstrings that start with a verb) and its formatting
	$(BIN)/ruff check src tests benchmarks train.py
	$(BIN)/ruff format --check src tests benchmarks train.py

clean:
	rm -rf outputs .pytest_cache
