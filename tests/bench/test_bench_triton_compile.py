"""``python -m benchmarks triton_compile``: STk's and MATk's Triton kernels compiled for CUDA targets without
a GPU. Triton's compiler needs its JIT, so the compiles run in processes without the interpreter that the
test run sets (tests/conftest.py)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.harness import main
from helpers import ROOT
from topklab.losses.aggregate import triton_pass

pytest.importorskip("triton")

# scale_kernel as it once was: `g` a scalar in one branch of a runtime `if` and a block in the other.
# Triton's interpreter runs it; its compiler refuses it.
MISTYPED_SCALE = """
import triton
import triton.language as tl


@triton.jit
def scale_kernel(grad_ptr, out_ptr, incoming_ptr, n, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    if n == total:
        g = tl.load(incoming_ptr).to(tl.float32)
        values = tl.load(grad_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (values * g).to(out_ptr.dtype.element_ty), mask=inside)
    else:
        g = tl.load(incoming_ptr + offs // n, mask=inside, other=1.0).to(tl.float32)
        values = tl.load(grad_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (values * g).to(out_ptr.dtype.element_ty), mask=inside)
"""
SWAPPED_IN = """
import sys
sys.path.insert(0, {folder!r})
from mistyped import scale_kernel
from topklab.losses.aggregate import triton_pass
triton_pass.kernels()["scale"] = scale_kernel
from benchmarks.harness import main
sys.exit(main({argv!r}))
"""


def compile_run(tmp_path, argv, script=None):
    """``python -m benchmarks triton_compile <argv>`` (or ``script``) with Triton's JIT and a cache of its own."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "benchmarks", *argv]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


def kernel_names() -> set[str]:
    return {kernel.fn.__name__ for kernel in triton_pass.kernels().values()}


def test_every_kernel_compiles_for_sm_90_in_each_dtype_and_layout(tmp_path):
    """One row short enough for one program and long enough for many (a solved row then takes its
    launches over many programs), three rows with a λ each and sharing one, float32 and bfloat16: every
    kernel is reached, and compiles to a cubin that records its registers."""
    out = tmp_path / "out"
    argv = ["triton_compile", "--archs", "90", "--sizes", "17", "20000", "--dtypes", "float32", "bfloat16"]
    done = compile_run(tmp_path, [*argv, "--out-dir", str(out)])
    assert done.returncode == 0, done.stderr
    (target,) = json.loads((out / "triton_compile_cpu.json").read_text())["result"]["targets"]
    assert target["arch"] == 90 and target["launches"] > 0
    assert {row["kernel"] for row in target["rows"]} == kernel_names()
    assert all(row["registers"] > 0 and row["warps"] > 0 for row in target["rows"])
    bfloat16 = [row for row in target["rows"] if "bfloat16" in row["reached_by"]]
    assert {row["kernel"] for row in bfloat16} == kernel_names()
    assert "| sm_90 | tracked_row_kernel |" in (out / "triton_compile_cpu.md").read_text()


def test_a_kernel_the_interpreter_runs_but_triton_cannot_compile_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "mistyped.py").write_text(MISTYPED_SCALE)
    spec = importlib.util.spec_from_file_location("mistyped", tmp_path / "mistyped.py")
    mistyped = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mistyped)
    grad, scaled, incoming = torch.ones(2, 8), torch.empty(2, 8), torch.tensor([2.0, 3.0])
    mistyped.scale_kernel[(1,)](grad, scaled, incoming, 8, 16, BLOCK=16)  # the interpreter (tests/conftest.py)
    assert torch.equal(scaled, torch.tensor([[2.0] * 8, [3.0] * 8]))

    out = tmp_path / "out"
    argv = ["triton_compile", "--archs", "90", "--sizes", "17", "--dtypes", "float32", "--out-dir", str(out)]
    done = compile_run(tmp_path, argv, SWAPPED_IN.format(folder=str(tmp_path), argv=argv))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "failed to compile; the first: scale_kernel for sm_90 (STk (track), float32," in line, line
    assert "Mismatched type for g" in line and not out.exists()


def test_the_compile_check_refuses_the_interpreter_in_one_line(capsys, tmp_path):
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set for the test run (tests/conftest.py)
    assert main(["triton_compile", "--archs", "90", "--sizes", "17", "--out-dir", str(tmp_path)]) == 2
    assert "unset TRITON_INTERPRET" in capsys.readouterr().err and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_every_kernel_compiles_for_each_target_and_dtype(tmp_path):
    """The committed table's matrix: sm_80, sm_90, sm_100 and sm_120, float32, bfloat16 and float16."""
    done = compile_run(tmp_path, ["triton_compile", "--out-dir", str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr
    targets = json.loads((tmp_path / "out" / "triton_compile_cpu.json").read_text())["result"]["targets"]
    assert [target["arch"] for target in targets] == [80, 90, 100, 120]
    assert all({row["kernel"] for row in target["rows"]} == kernel_names() for target in targets)
