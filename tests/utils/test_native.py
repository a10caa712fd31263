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
