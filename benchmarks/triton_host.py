"""The host's part of STk's and MATk's Triton training call, measured on the CPU: forward + backward with
every Triton launch replaced by one that does nothing, beside ``x.mean()``'s forward + backward.

    python -m benchmarks triton_host [--sizes 1000] [--k 0.1] [--rules track solve] [--calls 2000]
                                     [--rounds 7] [--threads 1] [--launcher] [--out-dir results/bench]

On a GPU, below about 1e7 losses a call costs what the host takes to issue it: ``x.mean()``'s forward and
backward took about 88 µs on an H200, STk's tracked call 3.5× that (``results/bench/tracked_cuda.md``).
What the host spends is the module's Python path (the checks of :func:`~topklab.losses.aggregate.triton_pass.row_call`,
the autograd function, the two outputs' allocation, the backward) plus Triton's launcher. This
benchmark times the first part alone: the kernels are swapped for no-ops (nothing is computed; the
values are not used), so the ratio to ``x.mean()`` is the floor the eager call cannot go below on any
device, whatever the kernels and the launcher cost. Each candidate is timed ``--calls`` times in a row
per round, the candidates interleaved, ``--rounds`` rounds, the median kept. STk and MATk run with
``kernel="triton"`` under each of ``--rules`` (their first call, which starts λ, is a warm-up call).
Writes ``triton_host_cpu.{json,md}`` to ``--out-dir``.

``--launcher`` keeps Triton's own launch path (``JITFunction.run``: binding and specialising the
arguments, the cache lookup, the globals' check, the grid) and replaces only what needs a GPU: the driver
(device 0, stream 0, an sm_90 target; CUDA's own current device and stream cost a little more) and
each compiled kernel, whose launcher becomes a counted no-op (nothing is compiled). The ratio is then the
floor with Triton's Python launch path included; the CUDA launcher (its scratch allocations and
``cuLaunchKernel``) and the kernels come on top. ``x.mean()``'s time here includes its arithmetic
(a few µs at 10,000 losses), so as n grows the ratio understates the host's share: still a floor.
Needs Triton's JIT (not its interpreter: ``TRITON_INTERPRET`` unset). Writes
``triton_host_launcher_cpu.{json,md}``.
"""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

import torch

from benchmarks.harness.compare import interleaved, medians, ratios
from benchmarks.harness.output import Measured
from benchmarks.harness.triton_driver import Launches, NoOpKernel, stand_in_launches
from topklab.losses import MATk, STk
from topklab.losses.aggregate import triton_pass
from topklab.report.outputs import machine_label


class NoLaunches(Launches):
    """Every kernel by name, each ``kernel[grid](…)`` doing nothing but count itself in ``launches``, so
    that the table can show each call took the Triton path (a fallback to the torch path launches none)."""

    def __getitem__(self, key):
        return self if isinstance(key, str) else self._count

    def _count(self, *args, **kwargs) -> None:
        self.launches += 1


def launcher_kept(counter: Launches):
    """Triton's launch path as it is up to its launcher (a stand-in driver for an sm_90 target), every
    kernel a :class:`~benchmarks.harness.triton_driver.NoOpKernel` on first use (nothing is compiled)."""
    return stand_in_launches(lambda kernel, build, constexprs: NoOpKernel(counter))


def column_names(rules: list[str]) -> list[str]:
    """The timed calls in table order.

    Examples
    --------
    >>> column_names(["track"])
    ['x.mean()', 'STk (track)', 'MATk (track)']
    """
    return ["x.mean()", *(f"{loss} ({rule})" for rule in rules for loss in ("STk", "MATk"))]


def candidates(n: int, k: int, rules: list[str]) -> dict:
    """``{name: forward + backward of one call}`` on a fresh ``(n,)`` row: ``x.mean()``, then STk and MATk
    under each rule (started by one call)."""
    x = torch.rand(n).mul(3).requires_grad_()

    def step(loss):
        def call():
            x.grad = None
            loss(x).backward()

        return call

    calls = {"x.mean()": step(lambda x: x.mean())}
    for rule in rules:
        for loss in (STk, MATk):
            module = loss(k=k, lam_update=rule, kernel="triton")
            module(x.detach())
            calls[f"{loss.__name__} ({rule})"] = step(module)
    return calls


def arguments(parser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000], help="losses per row")
    parser.add_argument("--k", type=float, default=0.1, help="k as a fraction of n")
    parser.add_argument("--rules", nargs="+", default=["track", "solve"])
    parser.add_argument("--calls", type=int, default=2000, help="calls a candidate per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--launcher", action="store_true", help="keep Triton's launch path (a stand-in driver)")
    parser.add_argument("--out-dir", type=Path, default=Path("results/bench"))


def measure(args) -> Measured:
    torch.set_num_threads(args.threads)
    stubs = NoLaunches()
    rows = []
    replaced = launcher_kept(stubs) if args.launcher else mock.patch.object(triton_pass, "kernels", lambda: stubs)
    with replaced:
        for n in args.sizes:
            k = max(1, round(args.k * n))
            calls = candidates(n, k, args.rules)

            def clock(call):
                before, start = stubs.launches, time.perf_counter()
                for _ in range(args.calls):
                    call()
                return (time.perf_counter() - start) / args.calls, (stubs.launches - before) / args.calls

            times, launches = interleaved(calls, args.rounds, clock)
            us = {name: seconds * 1e6 for name, seconds in medians(times).items()}
            rows.append({"n": n, "k": k, "us": us, "ratio": ratios(us, "x.mean()"), "launches": launches})
            print(n, " ".join(f"{name} {ratio:.2f}" for name, ratio in rows[-1]["ratio"].items()), flush=True)
    meta = {"machine": machine_label(torch.device("cpu"), args.threads), "torch": torch.__version__}
    config = {key: getattr(args, key) for key in ("sizes", "k", "rules", "calls", "rounds", "threads", "launcher")}
    stem = "triton_host_launcher_cpu" if args.launcher else "triton_host_cpu"
    return Measured(stem, {"meta": meta, "rows": rows}, config, args.out_dir)


def render(result: dict) -> str:
    """µs per forward + backward and the ratio to ``x.mean()``'s, per n."""
    meta, rows = result["result"]["meta"], result["result"]["rows"]
    names = column_names(result["config"]["rules"])
    if result["config"].get("launcher"):
        title, stubbed = "Triton's launch path kept", "Triton's launch path as it is up to its CUDA launcher (a no-op)"
        on_top = "the CUDA launcher and the kernels come on top"
    else:
        title, stubbed = "launches stubbed", "every Triton launch a no-op"
        on_top = "the kernels and Triton's launcher come on top"
    lines = [
        f"# The host's part of the Triton training call ({title}) against x.mean() on the CPU",
        "",
        f"Forward + backward per call, {stubbed}; {result['config']['calls']} calls a candidate "
        f"per round, interleaved, median of {result['config']['rounds']} rounds; {meta['machine']}, torch "
        f"{meta['torch']}. Produced by `{result['command']}`. The ratio is the floor "
        f"of the eager call's ratio on any device: {on_top}.",
        "",
        "| n | k | " + " | ".join(f"{name} µs (× x.mean())" for name in names) + " | Triton launches a call |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row['us'][name]:.1f} ({row['ratio'][name]:.2f}×)" for name in names)
        launches = ", ".join(f"{name} {row['launches'][name]:g}" for name in names[1:])
        lines.append(f"| {row['n']} | {row['k']} | {cells} | {launches} |")
    return "\n".join(lines) + "\n"
