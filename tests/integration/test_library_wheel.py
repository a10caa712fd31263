"""The library installs on its own: the wheel built from pyproject.toml and
setup.py requires torch and numpy only and carries its C++ kernels compiled; in a fresh venv that
holds nothing else (torch, numpy and torch's own runtime dependencies, linked offline from this
project's .venv; no download) the README's library example and a top-k operator run with no Hydra,
no ninja and no C++ compiler reachable, on the prebuilt kernels, and nothing is compiled:
TORCH_EXTENSIONS_DIR (where a kernel would be built on first use) and the inductor cache stay empty.

The last test shows what the fast paths do there where the prebuilt kernels are not used
(``TOPKLAB_PREBUILT=0``): the native kernel cannot be built (no ninja) and the compiled one finds
no compiler, so both fall back, with one warning each, to the eager kernel and its values."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import ROOT

LIBRARY_REQUIREMENTS = {"torch", "numpy"}
README_SECTION = "## Use the losses in your own loop"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runtime_closure(names) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need at run time (their requirements without extras, recursively)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[key] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(seen.values())


def link_distributions(dists, folder: Path) -> list[str]:
    """Symlinks in ``folder`` to every top-level file and package of ``dists`` (in this venv's site-packages)."""
    folder.mkdir()
    linked = []
    for dist in dists:
        for entry in sorted({Path(str(f)).parts[0] for f in dist.files or []}):
            if entry == ".." or entry.endswith(".pth") or entry == "__pycache__" or (folder / entry).exists():
                continue  # scripts outside site-packages, and .pth hooks (e.g. setuptools' distutils shim)
            (folder / entry).symlink_to(Path(dist.locate_file(entry)).resolve())
            linked.append(entry)
    return linked


def readme_library_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    return PYTHON_BLOCK.findall(section)[0]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """(python of a fresh venv with torch, numpy and the topklab wheel, its environment, the wheel)."""
    # `build` is pinned in requirements-cpu.txt: a set-up without it fails here rather than skipping the test
    assert importlib.util.find_spec("build"), "the wheel is built with `build`: run `make setup` (requirements-cpu.txt)"
    tmp = tmp_path_factory.mktemp("library_wheel")
    # Build from a copy of the sources: --no-isolation writes build/ and *.egg-info next to them. The
    # copy keeps `make setup`'s in-place kernels, which setup.py reuses where their stamps match
    # (tests/utils/test_native.py checks which it reuses and which it would compile).
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src" / "topklab",
        source / "src" / "topklab",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(tmp / "dist"), str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (wheel,) = (tmp / "dist").glob("topklab-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    link_distributions(runtime_closure(sorted(LIBRARY_REQUIREMENTS)), tmp / "torch_runtime")
    Path(purelib, "torch_runtime.pth").write_text(f"{tmp / 'torch_runtime'}\n")
    # this venv's pip installs into the bare one (which has no pip); the wheel alone, offline
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "-q",
            str(wheel),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"pip install of the wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    for name in ("home", "torch_extensions", "inductor"):
        (tmp / name).mkdir()
    run_env = {
        "PATH": str(venv / "bin"),  # not .venv/bin (ninja, the project's tools), not /usr/bin (gcc, g++, c++)
        "HOME": str(tmp / "home"),
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
        "CC": "/nonexistent/cc",
        "CXX": "/nonexistent/c++",
        "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
    }
    return python, run_env, wheel


def run_bare(python: Path, env: dict, script: str, timeout: int = 300) -> dict:
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(script)],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"in the bare venv:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def folder_contents(path: str) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*"))


def test_the_wheel_requires_torch_and_numpy_only(bare):
    _, _, wheel = bare
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    required = [
        Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert {r.name for r in required if r.marker is None} == LIBRARY_REQUIREMENTS
    extras = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert {"experiments", "tabular", "translation", "vision", "docs"} <= extras
    for package, kernel in (("losses/aggregate", "thresholded_cpu"), ("operators", "pav_cpu")):
        assert f"topklab/{package}/{kernel}.cpp" in names  # the source: what the prebuilt module is checked against
        assert any(re.fullmatch(rf"topklab/{package}/_{kernel}\..+\.so", name) for name in names), names
    assert not wheel.name.endswith("-none-any.whl"), "a wheel with compiled kernels is platform-specific"


def test_the_readme_example_runs_without_the_experiment_stack(bare):
    python, env, _ = bare
    started = time.perf_counter()
    result = run_bare(
        python,
        env,
        f"""
        import importlib.util, json, math, sys
        example = {readme_library_example()!r}
        try:
            import hydra
            hydra_importable = True
        except ImportError:
            hydra_importable = False
        import torch
        import topklab, topklab.losses, topklab.operators
        from topklab.losses import TopKCrossEntropy
        from topklab.losses.aggregate import kernels
        from topklab.operators import DiffSortNet, LapSum

        torch.manual_seed(0)
        namespace = {{"x": torch.randn(32, 14), "y": torch.randint(0, 2, (32,)).float() * 2 - 1}}
        exec(example, namespace)
        loss, optimizer = namespace["loss"], namespace["optimizer"]
        loss.backward()
        optimizer.step()
        scores = torch.randn(8, 20, requires_grad=True)
        p = LapSum(alpha=0.5).soft_topk(scores, k=5)
        ce = TopKCrossEntropy([0.5, 0.5], operator=DiffSortNet("odd_even"), num_classes=20)(scores, torch.arange(8))
        (p.sum() + ce.mean()).backward()
        print(json.dumps({{
            "hydra_importable": hydra_importable,
            "loaded": sorted(m for m in ("hydra", "omegaconf", "ninja", "tqdm") if m in sys.modules),
            "topklab_file": topklab.__file__, "version": topklab.__version__, "prefix": sys.prefix,
            "ninja_on_path": __import__("shutil").which("ninja"), "cxx_on_path": __import__("shutil").which("g++"),
            "loss": loss.item(), "row_sums": p.sum(1).tolist(), "ce": ce.tolist(),
            "grad_finite": bool(torch.isfinite(scores.grad).all()),
            "native": kernels.native_built() and kernels.native_extension().__file__.startswith(sys.prefix),
        }}))
    """,
    )
    elapsed = time.perf_counter() - started
    assert result["hydra_importable"] is False, "hydra is importable in the bare venv: it is not bare"
    assert result["loaded"] == [], f"importing the library loaded {result['loaded']}"
    assert result["topklab_file"].startswith(result["prefix"]), "topklab came from the source tree, not the wheel"
    declared = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert result["version"] == declared, "topklab.__version__ is not the installed wheel's version"
    assert result["ninja_on_path"] is None and result["cxx_on_path"] is None
    assert all(map(_finite, [result["loss"], *result["ce"]])) and result["grad_finite"]
    assert all(abs(s - 5) < 1e-4 for s in result["row_sums"])
    assert result["native"], "the example's STk did not run on the wheel's prebuilt C++ kernel"
    assert folder_contents(env["TORCH_EXTENSIONS_DIR"]) == [], "the native kernel was built"
    assert folder_contents(env["TORCHINDUCTOR_CACHE_DIR"]) == [], "something was compiled by inductor"
    print(f"bare-venv example: {elapsed:.1f} s")


def test_the_prebuilt_kernels_serve_every_n_without_a_compiler(bare):
    """kernel="auto" (default compile_min_n) at n = 16 and 16,384, and SparseTopK's PAV: the wheel's
    C++ modules, no warning, nothing built; STk's value equals the eager kernel's to float32 rounding."""
    python, env, _ = bare
    result = run_bare(
        python,
        env,
        """
        import json, sys, warnings
        import torch
        from topklab.losses import STk
        from topklab.losses.aggregate import kernels
        from topklab.operators import SparseTopK
        from topklab.operators.sparse_topk import native_pav

        torch.manual_seed(0)
        gaps = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n in (16, 16384):
                losses = torch.rand(n) * 3
                values = []
                for kernel in ("auto", "eager"):
                    aggregate = STk(k=0.9, delta=0.01, kernel=kernel)
                    for _ in range(3):  # the first call starts λ; the next ones take the one-row lane
                        x = losses.clone().requires_grad_()
                        value = aggregate(x)
                        value.backward()
                    values.append((value.item(), x.grad))
                gaps.append(abs(values[0][0] - values[1][0]) + float((values[0][1] - values[1][1]).abs().max()))
            mask = SparseTopK(kernel="native").soft_topk(torch.randn(4, 30), k=5)
        print(json.dumps({
            "gaps": gaps, "warnings": [str(w.message)[:300] for w in caught],
            "modules": [kernels.native_extension().__file__, native_pav().__file__], "prefix": sys.prefix,
            "mask_rows": mask.sum(1).tolist(),
        }))
    """,
    )
    assert result["warnings"] == []
    assert all(path.startswith(result["prefix"]) for path in result["modules"]), result["modules"]
    assert all(gap < 1e-5 for gap in result["gaps"]), result["gaps"]
    assert all(abs(s - 5) < 1e-4 for s in result["mask_rows"])
    assert folder_contents(env["TORCH_EXTENSIONS_DIR"]) == [], "a kernel was built"


def test_the_fast_kernels_fall_back_where_nothing_can_be_built(bare):
    """TOPKLAB_PREBUILT=0, kernel="auto": native (no ninja) -> compiled (no compiler) -> eager."""
    python, env, _ = bare
    started = time.perf_counter()
    result = run_bare(
        python,
        {**env, "TOPKLAB_PREBUILT": "0"},
        """
        import json, time, warnings
        import torch
        from topklab.losses import STk

        torch.manual_seed(0)
        losses = torch.rand(20000) * 3
        values = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for kernel in ("auto", "eager"):
                aggregate = STk(k=0.9, delta=0.01, kernel=kernel)
                x = losses.clone().requires_grad_()
                started = time.perf_counter()
                value = aggregate(x)
                value.backward()
                values[kernel] = (value.item(), x.grad.clone(), time.perf_counter() - started)
            again = time.perf_counter()
            STk(k=0.9, delta=0.01)(losses.clone().requires_grad_()).backward()
            second = time.perf_counter() - again
        print(json.dumps({
            "auto": values["auto"][0], "eager": values["eager"][0],
            "grad_close": bool(torch.allclose(values["auto"][1], values["eager"][1], rtol=0, atol=1e-7)),
            "first_call_s": values["auto"][2], "second_call_s": second,
            "warnings": [str(w.message)[:300] for w in caught],
        }))
    """,
    )
    elapsed = time.perf_counter() - started
    assert abs(result["auto"] - result["eager"]) <= 1e-6 * max(1.0, abs(result["eager"])) and result["grad_close"]
    fallbacks = [w for w in result["warnings"] if "kernel of the thresholded losses failed" in w]
    assert any(w.startswith("the native kernel") for w in fallbacks), result["warnings"]
    assert any(w.startswith("the compiled kernel") for w in fallbacks), result["warnings"]
    assert len(fallbacks) == 2, "each failed path is tried once per process"
    assert folder_contents(env["TORCH_EXTENSIONS_DIR"]) == [], "the native kernel was built"
    print(
        f"fallback: first call {result['first_call_s']:.1f} s, second {result['second_call_s']:.3f} s, "
        f"test {elapsed:.1f} s, inductor cache {len(folder_contents(env['TORCHINDUCTOR_CACHE_DIR']))} files; {fallbacks}"
    )


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")
