"""The C++ extensions, compiled into the package (the wheel; `pip install --no-build-isolation -e .`):
each stamped with its source's SHA-256 and the torch it is built against, which
topklab.utils.native.load_native checks before it uses one. Build against the torch you run
(--no-build-isolation; an isolated build would fetch another torch). Metadata: pyproject.toml."""

import hashlib
import os
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# topklab.utils.native.CFLAGS, and -g0: no debug information (Python's own flags ask for -g, which doubles the build)
CFLAGS = ["-O3", "-fopenmp-simd", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-g0"]
EXTENSIONS = {
    "topklab.losses.aggregate._thresholded_cpu": "src/topklab/losses/aggregate/thresholded_cpu.cpp",
    "topklab.operators._pav_cpu": "src/topklab/operators/pav_cpu.cpp",
}


def extension(name: str, source: str) -> CppExtension:
    sha = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    stamps = [f'-DTOPKLAB_SOURCE_SHA="{sha}"', f'-DTOPKLAB_TORCH_VERSION="{torch.__version__}"']
    return CppExtension(name, [source], extra_compile_args=CFLAGS + stamps)


setup(
    ext_modules=[extension(name, source) for name, source in EXTENSIONS.items()],
    # the extensions compile side by side; without ninja, whose per-extension build files would share one folder
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
