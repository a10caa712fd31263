#!/usr/bin/env bash
# The GPU checks (README "On a GPU machine without registry access"), one stage per call, on a CUDA
# machine whose Python already holds torch: run from the repository root after
# `scripts/offline_wheels.sh .whl` was run where a registry is reachable and .whl/ was copied along.
#   scripts/gpu_check.sh tests    OUT   the gpu-marked tests, then the default suite (16 workers)
#   scripts/gpu_check.sh bench    OUT   bench_topk (n = 1e5 … 1e8) and the ResNet-32 epoch, both data paths
#   scripts/gpu_check.sh peft     OUT   bench_peft, batch 128, fp16 and bf16 (channels-last)
#   scripts/gpu_check.sh multi30k OUT   the Multi30k Average / ATk / STk rows, seed 0, side by side on the GPU
# Logs and written results go to a scratch folder, packed into OUT/<stage>.tar.gz (default OUT: results/bench).
set -uo pipefail
stage=${1:?stage: tests | bench | peft | multi30k}
pack=$(realpath -m "${2:-results/bench}")
out=$(mktemp -d)
mkdir -p "$pack"
eval "$(scripts/offline_setup.sh "${WHEELS:-.whl}")" || exit 2
export PYTHONUNBUFFERED=1 TOPKLAB_ROOT=$(pwd)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton, timm, hydra; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'timm', timm.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(0))"
    git rev-parse HEAD 2>/dev/null || echo "no .git here: provenance records no commit"
} 2>&1 | tee "$out/$stage-machine.txt"
case $stage in
tests)
    timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider 2>&1 | tee "$out/tests-gpu.log"
    timeout 360 python3 -m pytest -q -m "not slow" -n 16 -p no:cacheprovider 2>&1 | tail -80 >"$out/tests-default.log"
    tail -30 "$out/tests-default.log" ;;
bench)
    timeout 330 python3 scripts/bench_topk.py --device cuda --max-exp 8 --out-dir "$out" 2>&1 | tail -40
    timeout 240 python3 scripts/bench_cifar_epoch.py --device cuda --epochs 3 --workers 8 --out-dir "$out" 2>&1 | tail -12 ;;
peft)
    for amp in fp16 bf16; do
        timeout 270 python3 scripts/bench_peft.py --device cuda --batch 128 --steps 20 --amp $amp --channels-last \
            --tuners adaptformer lora vpt_deep full --out-dir "$out" --tag "cuda_$amp" 2>&1 | tail -25
    done ;;
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
*) echo "error: unknown stage $stage (tests | bench | peft | multi30k)" >&2; exit 2 ;;
esac
tar -czf "$pack/$stage.tar.gz" -C "$out" . && ls -la "$out" "$pack"
