"""Why one seed gives other numbers at another torch thread count: the batches, or the arithmetic?

    python scripts/thread_probe.py [--row fmnistlt/la] [--steps 200] [--out-dir results/bench]

For ``experiment=<row>`` and its seed, at 1 and at 2 torch threads, each in its own process: the
training run's first ``--steps`` steps through the engine, recording a float64 checksum of every
training batch the model sees and the parameters after steps 0, 1, 2, 5, 10, 20, 50, 100, 200, ….
Then, in this process, the first batch through the model at both thread counts: the first layer whose
output differs, and that layer's float32 error against float64 at each count. Writes
``thread_probe_cpu.{json,md}``; the last line says whether the batches agreed and how far the
parameters had drifted apart at the last recorded step.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
RECORDED_STEPS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def compose(row: str, log_dir: str, *extra: str):
    from hydra import initialize_config_dir

    from topklab.config import compose_run

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose_run(
            [
                f"paths.log_dir={log_dir}",
                f"experiment={row}",
                "engine.checkpoint=false",
                "engine.progress=false",
                "result_file=null",
                "logger=none",
                *extra,
            ]
        )


def trajectory(row: str, steps: int, threads: int, out: str) -> None:
    """In a child process: train ``steps`` steps at ``threads`` threads, saving checksums and parameters."""
    import numpy as np
    import torch

    import topklab.engine.loop as loop
    from topklab.engine.run import train

    torch.set_num_threads(threads)
    checksums, parameters = [], {}
    fit = loop.Engine.fit

    def recording_fit(self, module, optimizer, *args, **kwargs):
        model = module.model
        flat = lambda: torch.cat([p.detach().flatten().double() for p in model.parameters()]).numpy().copy()  # noqa: E731
        parameters[0] = flat()
        model.register_forward_pre_hook(
            lambda m, a: checksums.append(float(a[0].double().sum())) if m.training else None
        )
        optimizer.register_step_post_hook(
            lambda *_: parameters.__setitem__(len(checksums), flat()) if len(checksums) in RECORDED_STEPS else None
        )
        return fit(self, module, optimizer, *args, **kwargs)

    loop.Engine.fit = recording_fit
    with tempfile.TemporaryDirectory() as tmp:
        train(compose(row, tmp, f"engine.max_steps={steps}"), Path(tmp) / "run")
    np.savez(out, checksums=np.array(checksums), **{f"step{k}": v for k, v in parameters.items()})


def first_batch_layers(row: str) -> dict:
    """The first batch through the model at 1 and 2 threads: the first layer that differs, and its error."""
    import torch

    from topklab.engine.run import build_run
    from topklab.utils.seed import seed_everything

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(row, tmp)
        seed_everything(cfg.seed)
        data, model, *_ = build_run(cfg)
    x, _ = next(iter(data.train_loader(cfg.engine.batch_size, False, cfg.seed, torch.device("cpu")).batches(0)))
    leaves = {name: module for name, module in model.named_modules() if not list(module.children())}

    def activations(threads: int, dtype) -> list:
        torch.set_num_threads(threads)
        net = copy.deepcopy(model).to(dtype).train()
        seen = []
        for name, module in net.named_modules():
            if name in leaves:
                module.register_forward_hook(lambda m, i, o, name=name: seen.append((name, o.detach().double())))
        net(x.to(dtype))
        return seen

    one, two, exact = activations(1, torch.float32), activations(2, torch.float32), activations(1, torch.float64)
    for (name, a), (_, b), (_, ref) in zip(one, two, exact):
        if not torch.equal(a, b):
            return {
                "first_differing_layer": name,
                "layer": type(leaves[name]).__name__,
                "relative_difference": float((a - b).norm() / a.norm()),
                "error_vs_float64": {
                    "1": float((a - ref).norm() / ref.norm()),
                    "2": float((b - ref).norm() / ref.norm()),
                },
            }
    return {"first_differing_layer": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="fmnistlt/la")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))
    parser.add_argument("--trajectory", nargs=2, metavar=("THREADS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trajectory:
        trajectory(args.row, args.steps, int(args.trajectory[0]), args.trajectory[1])
        return
    if args.steps < 1:
        print("error: --steps must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    import numpy as np

    from topklab.report import make_result, write_result
    from topklab.utils.io import atomic_write_text
    from topklab.utils.provenance import collect

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (1, 2):
            out = f"{tmp}/threads{threads}.npz"
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--row",
                    args.row,
                    "--steps",
                    str(args.steps),
                    "--trajectory",
                    str(threads),
                    out,
                ],
                check=True,
                env={**os.environ, "OMP_NUM_THREADS": str(threads)},
            )
            runs[threads] = dict(np.load(out))
    a, b = runs[1], runs[2]
    same_batches = len(a["checksums"]) == len(b["checksums"]) and bool(np.array_equal(a["checksums"], b["checksums"]))
    drift = []
    for step in RECORDED_STEPS:
        if f"step{step}" in a and f"step{step}" in b:
            pa, pb = a[f"step{step}"], b[f"step{step}"]
            update = pa - a["step0"]
            drift.append(
                {
                    "step": step,
                    "parameters_relative": float(np.linalg.norm(pa - pb) / np.linalg.norm(pa)),
                    "update_relative": float(np.linalg.norm(pa - pb) / np.linalg.norm(update)) if step else 0.0,
                }
            )
    layers = first_batch_layers(args.row)
    command = " ".join(["python", "scripts/thread_probe.py", *sys.argv[1:]])
    lines = [
        f"# One seed at 1 and 2 torch threads: `experiment={args.row}`",
        "",
        f"Produced by `{command}`.",
        "",
        f"- Training batches seen in the first {len(a['checksums'])} steps identical at both thread counts "
        f"(float64 checksum of each): **{same_batches}**.",
        f"- Initial parameters identical: {bool(np.array_equal(a['step0'], b['step0']))}.",
    ]
    if layers["first_differing_layer"]:
        errors = layers["error_vs_float64"]
        lines.append(
            f"- The first batch's first differing output is layer `{layers['first_differing_layer']}` "
            f"({layers['layer']}): relative difference {layers['relative_difference']:.2e}; its float32 error "
            f"against float64 is {errors['1']:.2e} at 1 thread and {errors['2']:.2e} at 2."
        )
    else:
        lines.append("- The first batch's layer outputs are identical at both thread counts.")
    lines += ["", "| step | ‖θ₁ − θ₂‖ / ‖θ₁‖ | ‖θ₁ − θ₂‖ / ‖θ₁ − θ₀‖ |", "|---|---|---|"]
    lines += [f"| {d['step']} | {d['parameters_relative']:.2e} | {d['update_relative']:.2e} |" for d in drift]
    last = drift[-1]
    lines += [
        "",
        f"batches identical: {same_batches}; parameters apart by {last['parameters_relative']:.2e} "
        f"(relative) after {last['step']} steps",
    ]
    out_dir = Path(args.out_dir)
    write_result(
        out_dir / "thread_probe_cpu.json",
        make_result(
            "bench",
            "thread_probe_cpu",
            {"same_batches": same_batches, "drift": drift, "first_batch": layers},
            command=command,
            config={"row": args.row, "steps": args.steps},
            provenance=collect(ROOT),
        ),
    )
    atomic_write_text(out_dir / "thread_probe_cpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
