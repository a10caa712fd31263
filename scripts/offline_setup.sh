#!/usr/bin/env bash
# On a GPU machine without registry access: install the wheels made by scripts/offline_wheels.sh into
# a site folder over the machine's own torch, and print the line that puts it and src/ on the path.
#   eval "$(scripts/offline_setup.sh .whl)" && python3 -m pytest -m gpu
set -euo pipefail
dir=${1:-.whl}
site=${SITE:-/tmp/topklab-site}
ls "$dir"/*.whl >/dev/null 2>&1 || { echo "error: no wheels in $dir; run scripts/offline_wheels.sh $dir on a machine with registry access" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl >&2
# the C++ kernels, built in place against this machine's torch (else each builds on first use, or runs eager)
python3 setup.py -q build_ext --inplace -j 2 >"$site/kernels-build.log" 2>&1 ||
    echo "warning: the C++ kernels did not build here ($site/kernels-build.log); they build on first use" >&2
echo "export PYTHONPATH=$site:$(pwd)/src\${PYTHONPATH:+:\$PYTHONPATH}"
