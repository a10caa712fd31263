"""The C++ extensions, compiled into the package (the wheel; `pip install --no-build-isolation -e .`):
each stamped with its source's SHA-256 and the torch it is built against, which
topklab.utils.native.load_native checks before it uses one. Build against the torch you run
(--no-build-isolation; an isolated build would fetch another torch). An extension already built in
place beside its source (`make setup`) with the same two stamps is copied rather than compiled again.
Metadata: pyproject.toml."""

import hashlib
import importlib.util
import os
import shutil
import sysconfig
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


def source_sha(source: str) -> str:
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def extension(name: str, source: str) -> CppExtension:
    stamps = [f'-DTOPKLAB_SOURCE_SHA="{source_sha(source)}"', f'-DTOPKLAB_TORCH_VERSION="{torch.__version__}"']
    return CppExtension(name, [source], extra_compile_args=CFLAGS + stamps)


def built_in_place(name: str, source: str) -> Path | None:
    """The module ``name`` built in place beside ``source``, where it was built from that source against this torch."""
    built = Path(source).parent / (name.rsplit(".", 1)[1] + sysconfig.get_config_var("EXT_SUFFIX"))
    if not built.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, built)
    try:
        module = importlib.util.module_from_spec(spec)  # loads the shared object
        spec.loader.exec_module(module)
    except ImportError:  # another platform's, or a broken file: compile
        return None
    stamps = (getattr(module, "SOURCE_SHA", None), getattr(module, "TORCH_VERSION", None))
    return built if stamps == (source_sha(source), torch.__version__) else None


# the extensions compile side by side; without ninja, whose per-extension build files would share one folder
class BuildOrReuse(BuildExtension.with_options(use_ninja=False)):
    def build_extension(self, ext):
        built = built_in_place(ext.name, ext.sources[0])
        if built is None:
            return super().build_extension(ext)
        target = Path(self.get_ext_fullpath(ext.name))
        if not target.exists() or not target.samefile(built):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, target)


setup(
    ext_modules=[extension(name, source) for name, source in EXTENSIONS.items()],
    cmdclass={"build_ext": BuildOrReuse},
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
