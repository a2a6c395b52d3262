# equishard — every target installs what it needs first, at the versions of constraints.txt
# (the install lock): `make shards` a .venv with torch==2.13.0 (CPU) and the pipeline's own
# dependencies; `make test` and the other development targets add the dev extra. `make
# test-latest` tries the newest releases in .venv-latest and says what changed; `make lock`
# pins them once they pass.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.equishard-installed
OUT    ?= build/demo
SAMPLES ?= 1000
SEED   ?= 0
WORKERS ?= 2
DP     ?= 8
NODES  ?= 2
SHARD_SIZE ?= 16MB
# `make shards`: the demo with video clips and recordings beside the images (MEDIA=0: images and
# text only, with InternVL's policy); its videos run in Qwen2-VL's vision tower, its recordings
# in Qwen2-Audio's encoder, so every phase is measured, balanced, written and drawn
MEDIA  ?= 1
ifeq ($(MEDIA),1)
POLICY ?= qwen2vl
BATCH  ?= 16
MEDIA_DEMO := --media
MEDIA_PREP := --video-rule qwen2vl --audio-rule qwen2audio
else
POLICY ?= internvl
endif
BATCH  ?= 4
NIGHT_POLICY ?= internvl
NIGHT_BATCH ?= 4
# `make shards ENGINE=ray`: prep and write on a local Ray cluster (same bytes as ENGINE=local)
ENGINE ?= local
# `make train`: a small generation written by `make shards` (56-px tiles so a CPU trains it in
# seconds per step; InternVL's videos as 4 frames of one tile, Qwen2.5-Omni's recordings in
# 2-s chunks), then DP x PP training on it through torchrun
TRAIN_OUT ?= build/train-demo
TRAIN_ARGS ?= --nproc 4 --dp 2 --pp 2 --steps 6 --schedule 1f1b
FAMILY ?= qwen2vl
BALANCE ?= both
PARALLEL ?= ddp
HF_OUT ?= build/train-hf-$(FAMILY)
HF_FALLBACK ?= --vision-policy internvl:max_tiles=4,tile_size=56
HF_AUDIO := qwen2_5_omni
# `make nightly-demo`: the demo set arriving over two days; day 1 through the full pipeline,
# day 2 (new samples, 5 updates, 3 deletions) through `equishard rebalance`, then the report
NIGHT_OUT ?= build/nightly
# `make gpu-smoke`: about ten minutes on a machine with one CUDA GPU (docs/training/equishard-train.md, "On a GPU")
GPU_OUT ?= build/gpu-smoke

.PHONY: install test-latest lock mutation shards train train-hf nightly-demo gpu-smoke gpu-check test test-slow test-all bench lint docs docs-check clean

LOCK   := constraints.txt
# every install takes the lock's versions; setuptools comes from the lock too (no build
# isolation: an isolated build would fetch the newest setuptools, outside the lock); the
# bytecode is compiled at install (tried without, 2026-12-07: install 40 s faster, make test
# 2.6 min slower, its tests that start subprocesses the most)
PIP    := $(BIN)/python -m pip install -c $(LOCK)
# the packages themselves through tools/install.py: uv (the lock's, installed by pip first) with
# pip's own indexes and constraints, its builds isolated but pinned by the lock
# (--build-constraints); pip where uv cannot stand in (45 s instead of 110 s on a fresh clone)
INSTALL := $(BIN)/python tools/install.py -c $(LOCK)
EDITABLE := --no-build-isolation --config-settings editable_mode=compat
CORE_STAMP := $(VENV)/.equishard-core

install: $(STAMP)

# the pipeline: what `make shards` needs (no test, docs, Ray, S3 or Energon packages)
$(CORE_STAMP): pyproject.toml Makefile $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) setuptools wheel uv
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) "torch==2.13.0"
	@# compat: the checkout joins sys.path (a .pth), so a user's data folder named like one of
	@# our packages (./shards) never hides it; the default import hook runs after that search
	$(INSTALL) -e . $(EDITABLE)
	@# compile the runtime balancing kernels into numba's cache now, not at a job's first step
	$(BIN)/python -c "from balancing.first_call import warm_up; warm_up()"
	@touch $(CORE_STAMP)

# development: the dev extra (tests, lint, docs, every optional extra the tests exercise)
$(STAMP): $(CORE_STAMP)
	$(INSTALL) -e ".[dev]" $(EDITABLE)
	$(BIN)/python tools/lock.py check $(LOCK)
	@touch $(STAMP)

# The newest releases of everything (torch stays the CPU 2.13.0) in a venv of their own, what
# changed against the lock, then the suite; not in CI. `make lock` then pins them on purpose.
LATEST ?= .venv-latest
test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	@# torch is held at the CPU 2.13.0 (an eager upgrade would take the newest, with CUDA wheels)
	echo "torch==2.13.0" > $(LATEST)/hold.txt
	$(LATEST)/bin/python -m pip install -c $(LATEST)/hold.txt --upgrade setuptools wheel torch uv
	$(LATEST)/bin/python -m pip install -c $(LATEST)/hold.txt --upgrade --upgrade-strategy eager \
		-e ".[dev]" $(EDITABLE)
	$(LATEST)/bin/python tools/lock.py diff $(LOCK)
	$(LATEST)/bin/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

lock:
	@test -x $(LATEST)/bin/python || { echo "make lock pins .venv-latest: run make test-latest first"; exit 2; }
	$(LATEST)/bin/python tools/lock.py write $(LOCK)

# The whole pipeline on the embedded demo set.
shards: $(CORE_STAMP)
	$(BIN)/equishard demo $(OUT)/raw --samples $(SAMPLES) --seed $(SEED) $(MEDIA_DEMO)
	$(BIN)/equishard prep $(OUT)/raw/demo.jsonl --image-root $(OUT)/raw \
		--tokenizer $(OUT)/raw/tokenizer.json --vision-policy $(POLICY) $(MEDIA_PREP) \
		--workers $(WORKERS) --engine $(ENGINE) -o $(OUT)/cost.parquet
	$(BIN)/equishard balance $(OUT)/cost.parquet --dp $(DP) --nodes $(NODES) \
		--target-batch $(BATCH) --seed $(SEED) $(PLAN_ARGS) -o $(OUT)/plan
	$(BIN)/equishard write $(OUT)/plan --cost-table $(OUT)/cost.parquet --out $(OUT)/shards \
		--shard-size $(SHARD_SIZE) --workers $(WORKERS) --engine $(ENGINE)
	$(BIN)/equishard verify $(OUT)/shards
	$(BIN)/equishard report $(OUT)/shards -o $(OUT)/report.html
	$(BIN)/equishard inspect $(OUT)/shards

train: $(STAMP)
	$(MAKE) shards OUT=$(TRAIN_OUT) SAMPLES=96 DP=4 NODES=2 BATCH=3 MEDIA=0 \
		POLICY="internvl:max_tiles=4,tile_size=56" MEDIA_DEMO=--media \
		MEDIA_PREP="--video-rule internvl:num_frames=4,tile_size=56 --audio-rule qwen2_5_omni" \
		PLAN_ARGS="--vit-hidden 32 --vit-layers 2 --llm-hidden 64 --llm-layers 4"
	OMP_NUM_THREADS=1 $(BIN)/equishard train --shards $(TRAIN_OUT)/shards $(TRAIN_ARGS) \
		--log $(TRAIN_OUT)/train.jsonl

# `make train-hf`: a tiny Hugging Face VLM (FAMILY=qwen2vl|qwen25vl|qwen3vl|glm4v|internvl|llava|
# llava_next|llava_onevision|gemma3|gemma4|smolvlm|mistral3|aya_vision|ernie45vl|deepseek_vl|janus|
# ovis2|aria|granite_docling|idefics2|deepseek_vl_hybrid|qwen2_5_omni; the HF_AUDIO ones on the
# demo with recordings, their audio towers balanced too)
# trained on the demo generation in a plain DDP loop (PARALLEL=fsdp2: FSDP2's fully_shard), 4 CPU
# ranks, with runtime balancing (BALANCE=off|encoder|llm|both). The demo set is prepped with the
# family's tokenizer, template and vision policy (examples/train_hf_vlm.py --print-prep-args,
# every family), so every sample's packed length is checked against prep's count (a family
# without prep settings would train on InternVL tiles, HF_FALLBACK, unchecked).
train-hf: $(STAMP)
	@test -f $(HF_OUT)/shards/CURRENT || { \
	  $(BIN)/equishard demo $(HF_OUT)/raw --samples 96 --seed $(SEED) \
	    $(if $(filter $(FAMILY),$(HF_AUDIO)),--media) && \
	  ARGS=$$(PYTHONPATH=. $(BIN)/python examples/train_hf_vlm.py --family $(FAMILY) \
	    --tokenizer $(HF_OUT)/raw/tokenizer.json --print-prep-args $(HF_OUT)/model 2>/dev/null \
	    || echo "--tokenizer $(HF_OUT)/raw/tokenizer.json $(HF_FALLBACK)") && \
	  echo "prep settings: $$ARGS" && \
	  $(BIN)/equishard prep $(HF_OUT)/raw/demo.jsonl --image-root $(HF_OUT)/raw $$ARGS \
	    --workers $(WORKERS) -o $(HF_OUT)/cost.parquet && \
	  $(BIN)/equishard balance $(HF_OUT)/cost.parquet --dp 4 --nodes 2 --target-batch 3 \
	    --seed $(SEED) -o $(HF_OUT)/plan && \
	  $(BIN)/equishard write $(HF_OUT)/plan --cost-table $(HF_OUT)/cost.parquet \
	    --out $(HF_OUT)/shards --workers $(WORKERS); }
	OMP_NUM_THREADS=1 $(BIN)/torchrun --nproc-per-node 4 examples/train_hf_vlm.py \
		--shards $(HF_OUT)/shards --tokenizer $(HF_OUT)/raw/tokenizer.json \
		--family $(FAMILY) --balance $(BALANCE) --parallel $(PARALLEL) --steps 6 \
		--jsonl $(HF_OUT)/train-hf.jsonl

nightly-demo: $(STAMP)
	rm -rf $(NIGHT_OUT)
	$(BIN)/equishard demo $(NIGHT_OUT)/raw --samples $(SAMPLES) --seed $(SEED) --days 2
	$(BIN)/equishard prep $(NIGHT_OUT)/raw/day-1.jsonl --image-root $(NIGHT_OUT)/raw \
		--tokenizer $(NIGHT_OUT)/raw/tokenizer.json --vision-policy $(NIGHT_POLICY) \
		--workers $(WORKERS) -o $(NIGHT_OUT)/day-1/cost.parquet
	$(BIN)/equishard balance $(NIGHT_OUT)/day-1/cost.parquet --dp $(DP) --nodes $(NODES) \
		--target-batch $(NIGHT_BATCH) --seed $(SEED) -o $(NIGHT_OUT)/day-1/plan
	$(BIN)/equishard write $(NIGHT_OUT)/day-1/plan --cost-table $(NIGHT_OUT)/day-1/cost.parquet \
		--out $(NIGHT_OUT)/shards --shard-size $(SHARD_SIZE) --workers $(WORKERS)
	$(BIN)/equishard rebalance --current $(NIGHT_OUT)/shards --new $(NIGHT_OUT)/raw/day-2.jsonl \
		--delete $(NIGHT_OUT)/raw/day-2.delete --workers $(WORKERS)
	$(BIN)/equishard rebalance --current $(NIGHT_OUT)/shards --new $(NIGHT_OUT)/raw/day-2.jsonl \
		--delete $(NIGHT_OUT)/raw/day-2.delete --workers $(WORKERS)
	$(BIN)/equishard verify $(NIGHT_OUT)/shards
	$(BIN)/equishard report $(NIGHT_OUT)/shards -o $(NIGHT_OUT)/report.html

# `make gpu-smoke`: the GPU tests, the demo pipeline planned for one rank, ten steps of the 1b
# VLM in bf16 with adaptive recomputation over NCCL, then the GPU benchmark (BENCHMARKS.md)
gpu-smoke: $(STAMP)
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
		'make gpu-smoke needs a CUDA GPU (torch sees none); on a CPU use make train')"
	$(BIN)/python -m pytest -m gpu -q
	$(MAKE) shards OUT=$(GPU_OUT) SAMPLES=400 DP=1 NODES=1 BATCH=4 MEDIA=0
	$(BIN)/python -m equishard train --shards $(GPU_OUT)/shards --nproc 1 --dp 1 --steps 10 \
		--model 1b --recompute adaptive --backend nccl --precision bf16 --log $(GPU_OUT)/train.jsonl
	$(BIN)/python bench/run.py --only gpu --out BENCHMARKS.md

# `make gpu-check`: the whole GPU check in one command on the machine's own Python and torch
# (tools/gpu_check.sh; no install step: a GPU machine may have no network)
gpu-check:
	bash tools/gpu_check.sh $(GPU_OUT)

# Default test run: everything but tests marked slow or gpu-only... gpu tests skip themselves.
# a worker per usable core (at most 4), each taking whole test files (a file's shared fixtures
# and its cached multi-rank runs stay in one process); TEST_WORKERS=0 runs in this process
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

# the members of the family sweeps and the long checks make test leaves out (tests/sweeps.py);
# CI runs make test, then this
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -n $(TEST_WORKERS) --dist loadfile

test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# `make mutation MODULE=shards/store/current_guard.py`: cosmic-ray over one module (its tests in
# tests/mutation/modules.toml; `make mutation` alone lists them); the result in MUTATION.md
MODULE ?=
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py $(MODULE)

bench: $(STAMP)
	$(BIN)/python bench/run.py --out BENCHMARKS.md

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link fails it
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the built site in headless Chromium (Debian's chromium: apt-get install chromium): the home
# page and two others render their navigation, code blocks and the report picture
docs-check: docs
	$(BIN)/python tools/docs_render_check.py site build/docs-check

clean:
	rm -rf build site .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
