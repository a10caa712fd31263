#!/usr/bin/env bash
# The GPU checks (README "On a GPU machine without registry access"), one stage per call, on a CUDA
# machine whose Python already holds torch: run from the repository root after
# `scripts/offline_wheels.sh .whl` was run where a registry is reachable and .whl/ was copied along.
#   scripts/gpu_check.sh STAGE [STAGE ...]   with OUT=<folder> (default results/bench)
#   tests     the gpu-marked tests, then the default suite (16 workers, one thread each)
#   gpu       the gpu-marked tests, then the default suite's losses and engine tests (a few minutes less)
#   topk      python -m benchmarks topk, n = 1e5 … 1e8
#   against   the library's defaults against the plain torch expressions (topk --against-torch), n = 1e3 … 1e8
#   compiled  the same with Average, STk and MATk also under torch.compile, n = 1e3, 1e6, 1e8
#   cifar     the ResNet-32 CIFAR-100-LT epoch, the device loader against a DataLoader
#   peft      python -m benchmarks peft, batch 128, fp16 and bf16 (channels-last)
#   multi30k  the Multi30k Average / ATk / STk rows, seed 0, side by side on the GPU
#   multi30k_k  the Multi30k k sweep: Average, ATk and STk at k/n = 0.5, 0.7, 0.9 and 0.96, seeds $SEEDS (default 0;
#             one call a seed), every run at once on the GPU (results/translation/multi30k_cuda/, its own table)
#   triton    the Triton training calls: their tests on CUDA, then the tracked_cuda benchmark, tracked and solved (n = 1e3 … 1e8)
#   graphed   the same benchmark with every call replayed from a CUDA graph (--graphed): the kernels without the host
# Logs and written results go to a scratch folder, packed into OUT/<stages>.tar.gz.
set -uo pipefail
stages="tests | gpu | topk | against | compiled | cifar | peft | multi30k | multi30k_k | triton | graphed"
[ $# -ge 1 ] || { echo "error: name a stage: $stages" >&2; exit 2; }
pack=$(realpath -m "${OUT:-results/bench}")
out=$(mktemp -d)
mkdir -p "$pack"
eval "$(scripts/offline_setup.sh "${WHEELS:-.whl}")" || exit 2
export PYTHONUNBUFFERED=1 TOPKLAB_ROOT=$(pwd)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton, timm, hydra; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'timm', timm.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(0))"
    git rev-parse HEAD 2>/dev/null || echo "no .git here: provenance records no commit"
} 2>&1 | tee "$out/machine.txt"
for stage in "$@"; do
case $stage in
tests)
    timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider 2>&1 | tee "$out/tests-gpu.log" | tail -15
    OMP_NUM_THREADS=1 timeout 280 python3 -m pytest -v -m "not slow" -n 16 -p no:cacheprovider -W ignore::pytest.PytestWarning \
        >"$out/tests-default.log" 2>&1
    grep -E "(FAILED|ERROR) tests/" "$out/tests-default.log" | sed 's/^\[gw[0-9]*\] *\[ *[0-9]*%\] *//' | sort | head -60
    grep -cE "PASSED tests/" "$out/tests-default.log"; tail -3 "$out/tests-default.log" ;;
gpu)
    timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider 2>&1 | tee "$out/tests-gpu.log" | tail -15
    OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -q -m "not slow" -n 16 -p no:cacheprovider -W ignore::pytest.PytestWarning \
        tests/losses tests/integration/test_vision_engine.py tests/integration/test_translation_engine.py \
        tests/integration/test_sweeps.py >"$out/tests-losses-engine.log" 2>&1
    grep -E "^(FAILED|ERROR) " "$out/tests-losses-engine.log" | head -40; tail -2 "$out/tests-losses-engine.log" ;;
topk)
    timeout 170 python3 -m benchmarks topk --device cuda --min-exp 5 --max-exp 8 --min-time 0.2 --out-dir "$out" \
        --losses Average "ATk (topk)" "MATk (eager)" "MATk (compiled)" "STk (eager)" "STk (compiled)" 2>&1 | tail -30 ;;
against)
    timeout 200 python3 -m benchmarks topk --device cuda --against-torch --sizes 1000 100000 1000000 10000000 100000000 \
        --out-dir "$out" 2>&1 | tail -12 ;;
compiled)
    timeout 240 python3 -m benchmarks topk --device cuda --against-torch --compiled --sizes 1000 1000000 100000000 \
        --out-dir "$out" 2>&1 | tail -12 ;;
cifar)
    timeout 130 python3 -m benchmarks cifar_epoch --device cuda --epochs 3 --workers 8 --out-dir "$out" 2>&1 | tail -12 ;;
peft)
    for amp in fp16 bf16; do
        timeout 140 python3 -m benchmarks peft --device cuda --batch 128 --steps 20 --amp $amp --channels-last \
            --tuners adaptformer lora vpt_deep full --out-dir "$out" --tag "cuda_$amp" 2>&1 | tail -25
    done
    # the objective's share with Average beside STk's
    timeout 140 python3 -m benchmarks peft --device cuda --batch 128 --steps 20 --amp bf16 --channels-last \
        --tuners adaptformer lora vpt_deep full --objective average --out-dir "$out" --tag cuda_bf16_average 2>&1 | tail -25 ;;
multi30k)
    # the rows read ../shared/data/multi30k (their config's root), so a copy carried in .gpu_data goes there
    [ -d ../shared/data/multi30k ] || { mkdir -p ../shared/data && cp -r .gpu_data/multi30k ../shared/data/; } || exit 2
    for row in average atk stk; do
        timeout 560 python3 train.py experiment=stk/multi30k/$row seed=0 engine.progress=false >"$out/multi30k-$row.log" 2>&1 &
        sleep 40  # the first row learns and caches the shared sentencepiece vocabulary
    done
    wait
    tail -3 "$out"/multi30k-*.log
    cp -r results/translation "$out/" 2>/dev/null ;;
multi30k_k)
    [ -d ../shared/data/multi30k ] || { mkdir -p ../shared/data && cp -r .gpu_data/multi30k ../shared/data/; } || exit 2
    timeout 120 python3 train.py experiment=stk/multi30k/average seed=0 engine.max_steps=1 result_file=null \
        paths.checkpoint_dir="$out/vocab-warmup" engine.progress=false >"$out/multi30k_k-vocab.log" 2>&1  # the shared vocabulary, once
    for seed in ${SEEDS:-0}; do
        for row in average atk atk_k50 atk_k70 atk_k90 stk stk_k50 stk_k70 stk_k90; do
            OMP_NUM_THREADS=1 timeout 540 python3 train.py experiment=stk/multi30k/$row seed=$seed engine.progress=false \
                >"$out/multi30k_k-$row-$seed.log" 2>&1 &
        done
    done
    wait
    tail -n 2 "$out"/multi30k_k-*.log
    cp -r results/translation "$out/" 2>/dev/null ;;
triton)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/losses/test_triton_pass.py \
        tests/integration/test_cuda.py -k "triton or cuda_graph" 2>&1 | tee "$out/tests-triton.log" | tail -15
    timeout 300 python3 -m benchmarks tracked_cuda --rules track solve --out "$out" 2>&1 | tee "$out/bench-tracked.log" | tail -40 ;;
graphed)
    timeout 280 python3 -m benchmarks tracked_cuda --rules track solve --graphed --out "$out" 2>&1 \
        | tee "$out/bench-graphed.log" | tail -40 ;;
*) echo "error: unknown stage $stage ($stages)" >&2; exit 2 ;;
esac
done
name=$(IFS=-; echo "$*")
tar -czf "$pack/$name.tar.gz" -C "$out" . && ls "$out"
