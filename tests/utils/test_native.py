"""topklab.utils.native: a prebuilt C++ module is used only where it was built from the source beside
it against the torch imported; otherwise the source is built (here a stand-in for the build)."""

from __future__ import annotations

import importlib
import warnings
from types import SimpleNamespace

import pytest
import torch

from topklab.utils import native

SOURCES = {
    "topklab.losses.aggregate._thresholded_cpu": "src/topklab/losses/aggregate/thresholded_cpu.cpp",
    "topklab.operators._pav_cpu": "src/topklab/operators/pav_cpu.cpp",
}


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "kernel.cpp"
    path.write_text("// a kernel\n")
    return path


@pytest.fixture
def built(monkeypatch):
    """Replaces the on-first-use build: returns what it was asked to build."""
    monkeypatch.setattr(native, "build", lambda source, name: ("built", source.name, name))


def prebuilt(monkeypatch, module):
    real = importlib.import_module

    def import_module(name, *args):
        if name == "fake.prebuilt":
            if module is None:
                raise ImportError("No module named 'fake.prebuilt'")
            return module
        return real(name, *args)

    monkeypatch.setattr(native.importlib, "import_module", import_module)


def test_a_matching_prebuilt_module_is_used(monkeypatch, source, built):
    module = SimpleNamespace(TORCH_VERSION=torch.__version__, SOURCE_SHA=native.source_sha(source))
    prebuilt(monkeypatch, module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load_native("fake.prebuilt", source, "jit") is module


@pytest.mark.parametrize(
    ("stamps", "why"),
    [
        ({"TORCH_VERSION": "0.0.1"}, "built against torch 0.0.1, this is torch"),
        ({"SOURCE_SHA": "0" * 64}, "kernel.cpp changed since it was built"),
    ],
)
def test_a_stale_prebuilt_module_says_why_and_the_source_is_built(monkeypatch, source, built, stamps, why):
    module = SimpleNamespace(**{"TORCH_VERSION": torch.__version__, "SOURCE_SHA": native.source_sha(source), **stamps})
    prebuilt(monkeypatch, module)
    with pytest.warns(UserWarning, match=why):
        assert native.load_native("fake.prebuilt", source, "jit") == ("built", "kernel.cpp", "jit")


def test_without_a_prebuilt_module_the_source_is_built_quietly(monkeypatch, source, built):
    prebuilt(monkeypatch, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load_native("fake.prebuilt", source, "jit") == ("built", "kernel.cpp", "jit")


def test_topklab_prebuilt_0_skips_the_prebuilt_module(monkeypatch, source, built):
    module = SimpleNamespace(TORCH_VERSION=torch.__version__, SOURCE_SHA=native.source_sha(source))
    prebuilt(monkeypatch, module)
    monkeypatch.setenv("TOPKLAB_PREBUILT", "0")
    with pytest.warns(UserWarning, match="TOPKLAB_PREBUILT=0"):
        assert native.load_native("fake.prebuilt", source, "jit") == ("built", "kernel.cpp", "jit")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_installed_kernels_are_built_from_these_sources(name):
    """`make setup` (pip install --no-build-isolation -e .) compiled the kernels; after editing a .cpp,
    `make setup` compiles them again (the set-up stamp depends on the sources)."""
    from helpers import ROOT

    module = importlib.import_module(name)
    assert native.prebuilt_mismatch(module, ROOT / SOURCES[name]) is None


@pytest.fixture
def setup_script(monkeypatch):
    """setup.py's namespace, run without its setup() call."""
    import runpy

    import setuptools

    from helpers import ROOT

    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: None)
    monkeypatch.chdir(ROOT)
    return runpy.run_path(str(ROOT / "setup.py"))


def test_setup_reuses_an_in_place_kernel_only_where_its_stamps_match(setup_script, tmp_path, monkeypatch):
    """A wheel built after `make setup` copies its kernels where they were built from the same source
    against the same torch; an edited source, another torch, or a file that does not load is compiled."""
    import shutil

    from helpers import ROOT

    name, source = "topklab.operators._pav_cpu", ROOT / SOURCES["topklab.operators._pav_cpu"]
    installed = importlib.import_module(name).__file__
    folder = tmp_path / "operators"
    folder.mkdir()
    shutil.copy2(source, folder / source.name)
    built_in_place = setup_script["built_in_place"]
    copy = folder / source.name  # the source beside the module
    assert built_in_place(name, str(copy)) is None  # nothing built here
    copied = folder / ("_pav_cpu" + installed.split("_pav_cpu", 1)[1])  # the same name and suffix
    shutil.copy2(installed, copied)
    assert built_in_place(name, str(copy)) == copied
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "0.0.0")
        assert built_in_place(name, str(copy)) is None  # another torch
    copy.write_text(source.read_text() + "// edited\n")
    assert built_in_place(name, str(copy)) is None  # another source
    broken = tmp_path / "broken"  # another path: this process has the loaded one's mapped
    broken.mkdir()
    shutil.copy2(source, broken / source.name)
    (broken / copied.name).write_bytes(b"not a shared object")
    assert built_in_place(name, str(broken / source.name)) is None
