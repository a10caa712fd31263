"""Every Triton kernel of STk's and MATk's training calls compiled for CUDA targets on a machine without
a GPU, down to the cubin, with what each specialisation asks of the chip.

    python -m benchmarks triton_compile [--archs 80 90 100 120] [--sizes 17 3000 20000] [--rows 3]
                                        [--dtypes float32 bfloat16 float16] [--out-dir results/bench] [--tag cpu]

On a CPU the kernels are tested in Triton's interpreter, which runs them as Python and so accepts what
Triton's compiler refuses (a variable that is a scalar in one branch of a runtime ``if`` and a block in
the other, say). This drives the same calls through Triton's JIT on a stand-in driver
(:mod:`benchmarks.harness.triton_driver`): each specialisation a call reaches is compiled by Triton for
the target (its own cache bypassed) and ptxas (the one Triton ships), and its launch is a no-op, so
nothing is computed. The calls: STk and MATk under ``track`` and ``solve`` and STk's default rule, in
each of ``--dtypes``, on one row of each of ``--sizes`` losses and on ``--rows`` rows of it, each with its
own λ (``rows=``) and sharing one; a first call to start λ, then forward + backward. Per target and
specialisation it records the registers a thread uses, its stack and local memory (spilled registers
land there), the shared memory a launch asks for, and the seconds the compile took. ``--archs``: compute
capabilities (80 A100, 90 H100/H200, 100 B200, 120 RTX 50). A specialisation that fails to compile is a
one-line error naming it, after the rest have been tried, and nothing is written. Needs Triton's JIT
(``TRITON_INTERPRET`` unset). Writes ``triton_compile_<tag>.{json,md}``.

Another Triton than the project's (a GPU machine's own, say) compiles the same way from a folder of its
own: ``pip install --no-deps --target DIR triton==3.6.0``, then ``PYTHONPATH=DIR:src:.`` before the
command, with ``--tag triton3.6.0_cpu``; the table names the Triton that compiled.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness.output import Measured
from benchmarks.harness.triton_driver import Launches, NoOpKernel, stand_in_launches
from topklab.losses import MATk, STk
from topklab.utils.errors import TopklabError

CALLS = {
    "STk (track)": lambda **options: STk(k=0.3, lam_update="track", **options),
    "MATk (track)": lambda **options: MATk(k=0.3, lam_update="track", **options),
    "STk (solve)": lambda **options: STk(k=0.3, lam_update="solve", **options),
    "MATk (solve)": lambda **options: MATk(k=0.3, lam_update="solve", **options),
    "STk (default)": lambda **options: STk(k=0.3, **options),
}
USAGE = re.compile(r"Function (\w+):\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")


def resource_usage(cubin: bytes) -> dict:
    """Registers a thread, stack and local bytes a thread, from ``cuobjdump --dump-resource-usage``
    (the one Triton ships) on the cubin."""
    from triton import knobs  # noqa: PLC0415

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        printed = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", file.name], capture_output=True, text=True
        ).stdout
    found = USAGE.search(printed)
    if found is None:
        raise TopklabError(f"cuobjdump printed no resource usage for a compiled kernel: {printed.strip()[:200]}")
    return {"registers": int(found[2]), "stack": int(found[3]), "local": int(found[4])}


def shapes(sizes: list[int], rows: int) -> list[tuple[tuple[int, ...], dict]]:
    """``(shape, loss options)``: one row of each size, ``rows`` rows with a λ each, ``rows`` sharing one.

    Examples
    --------
    >>> shapes([17], 3)
    [((17,), {}), ((3, 17), {'rows': 3}), ((3, 17), {})]
    """
    return [item for n in sizes for item in (((n,), {}), ((rows, n), {"rows": rows}), ((rows, n), {}))]


def why(error: Exception) -> str:
    """A compile error's last line that says something (not ptxas's repro command).

    Examples
    --------
    >>> why(RuntimeError("`ptxas` failed\\nptxas fatal : Value 'sm_30' is not defined\\nRepro command: ptxas x.ptx"))
    "ptxas fatal : Value 'sm_30' is not defined"
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("Repro command")]
    return said[-1] if said else type(error).__name__


class Compiles:
    """Each specialisation's compile for one target: what it uses, or the first line of why it failed,
    and which call reached it first."""

    def __init__(self, arch: int):
        self.arch, self.rows, self.failures, self.reached_by = arch, [], [], ""
        self.counter = Launches()

    def __call__(self, kernel, build, constexprs: dict) -> NoOpKernel:
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # a failed ptxas prints the whole PTX
                compiled = build()
        except Exception as error:  # noqa: BLE001  (Triton's compile errors share no base class)
            self.failures.append(f"{kernel.fn.__name__} for sm_{self.arch} ({self.reached_by}): {why(error)}")
        else:
            self.rows.append(
                {
                    "kernel": kernel.fn.__name__,
                    "reached_by": self.reached_by,
                    "constexprs": {name: _plain(value) for name, value in constexprs.items()},
                    "warps": compiled.metadata.num_warps,
                    "shared": compiled.metadata.shared,
                    **resource_usage(compiled.asm["cubin"]),
                    "seconds": round(time.perf_counter() - start, 3),
                }
            )
        return NoOpKernel(self.counter)


def thread_memory(row: dict) -> int:
    """A specialisation's stack and local bytes a thread: where spilled registers go."""
    return row["local"] + row["stack"]


def _plain(value):
    """A compile-time argument as JSON holds it (a Triton dtype or constexpr by its text)."""
    return value if isinstance(value, bool | int | float | str) or value is None else str(value)


def compile_for(arch: int, sizes: list[int], rows: int, dtypes: list[str]) -> Compiles:
    """Every specialisation the calls reach, compiled for compute capability ``arch``."""
    from triton import knobs  # noqa: PLC0415

    compiles = Compiles(arch)
    with knobs.compilation.scope(), stand_in_launches(compiles, arch):
        knobs.compilation.always_compile = True
        for name, make in CALLS.items():
            for dtype in dtypes:
                for shape, options in shapes(sizes, rows):
                    compiles.reached_by = f"{name}, {dtype}, {tuple(shape)}"
                    module = make(kernel="triton", **options)
                    for _ in range(2):  # the first call starts λ on the torch path
                        losses = torch.rand(*shape).mul(3).to(getattr(torch, dtype)).requires_grad_()
                        value = module(losses)
                        torch.autograd.grad(value, losses, torch.ones_like(value))
    return compiles


def arguments(parser) -> None:
    parser.add_argument("--archs", type=int, nargs="+", default=[80, 90, 100, 120], help="compute capabilities")
    parser.add_argument("--sizes", type=int, nargs="+", default=[17, 3000, 20000], help="losses per row")
    parser.add_argument("--rows", type=int, default=3, help="rows of the batched calls")
    parser.add_argument(
        "--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"], default=["float32", "bfloat16", "float16"]
    )
    parser.add_argument("--out-dir", type=Path, default=Path("results/bench"))
    parser.add_argument("--tag", default="cpu", help="the files' suffix: triton_compile_<tag>.{json,md}")


def measure(args) -> Measured:
    import triton  # noqa: PLC0415

    targets, failures = [], []
    for arch in args.archs:
        compiles = compile_for(arch, args.sizes, args.rows, args.dtypes)
        failures += compiles.failures
        targets.append({"arch": arch, "rows": compiles.rows, "launches": compiles.counter.launches})
        print(f"sm_{arch}: {len(compiles.rows)} compiled, {len(compiles.failures)} failed", flush=True)
    if failures:
        raise TopklabError(f"{len(failures)} Triton specialisations failed to compile; the first: {failures[0]}")
    config = {key: getattr(args, key) for key in ("archs", "sizes", "rows", "dtypes")}
    payload = {"triton": triton.__version__, "torch": torch.__version__, "targets": targets}
    spilled = sum(thread_memory(row) > 0 for target in targets for row in target["rows"])
    compiled = sum(len(target["rows"]) for target in targets)
    return Measured(
        f"triton_compile_{args.tag}", payload, config, args.out_dir, summary=f"{compiled} compiled, {spilled} spill"
    )


def render(result: dict) -> str:
    """Per target and kernel: the specialisations compiled and the most registers, local and shared
    memory any of them uses."""
    payload, config = result["result"], result["config"]
    lines = [
        "# STk's and MATk's Triton kernels compiled for CUDA targets on the CPU",
        "",
        f"Every specialisation the training calls reach (STk and MATk under track and solve, STk's default "
        f"rule; {', '.join(config['dtypes'])}; rows of {', '.join(map(str, config['sizes']))} losses, one row "
        f"and {config['rows']} rows), compiled by Triton {payload['triton']} down to the cubin without a GPU "
        f"(launches no-ops; torch {payload['torch']}). Produced by `{result['command']}`. Registers are a "
        "thread's; local memory (where spilled registers go) a thread's; shared memory a launch's.",
        "",
        "| target | kernel | specialisations | registers (most) | local bytes (most) | shared bytes (most) | compile s (sum) |",
        "|---|---|---|---|---|---|---|",
    ]
    for target in payload["targets"]:
        kernels = sorted({row["kernel"] for row in target["rows"]})
        for kernel in kernels:
            rows = [row for row in target["rows"] if row["kernel"] == kernel]
            lines.append(
                f"| sm_{target['arch']} | {kernel} | {len(rows)} | {max(r['registers'] for r in rows)} | "
                f"{max(thread_memory(r) for r in rows)} | {max(r['shared'] for r in rows)} | "
                f"{sum(r['seconds'] for r in rows):.1f} |"
            )
    spilled = [
        f"{row['kernel']} on sm_{target['arch']} ({row['reached_by']})"
        for target in payload["targets"]
        for row in target["rows"]
        if thread_memory(row) > 0
    ]
    lines += ["", "Local memory used by: " + ("; ".join(spilled) if spilled else "none (no specialisation spills).")]
    return "\n".join(lines) + "\n"
