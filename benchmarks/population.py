"""Model-steps per second of the population executor against the per-model engine, same work.

    python -m benchmarks population [--dataset australian] [--preset full] [--members 5280]

Both train the same kind of member (2-layer MLP, AdaGrad, STk, logistic loss; batch size and
validation interval from configs/preset/<preset>.yaml) for the same number of epochs with early
stopping disabled, so every member does the same steps. The per-model engine
(:class:`topklab.engine.Engine`) trains ``--loop-members`` members one by one; the population
executor trains ``--members`` at once (the STk grid spread over ``--splits`` splits), in both
layouts: ``gathered`` (each member gathers its own batch; what the tabular tables use) and
``grouped`` (members of a split share its batch). Writes ``population_<dataset>_cpu.{json,md}``: the
rates and the peak RSS after each phase; the last line printed is the gathered population's ratio to
the engine, ``speedup: N``.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from benchmarks.harness.isolation import project_root
from benchmarks.harness.memory import max_rss_mb as peak_rss_mb
from benchmarks.harness.output import Measured

ROOT = project_root()


def grid_members(n: int, n_splits: int):
    from topklab.engine.population import Members

    ks = [1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    combos = list(
        itertools.product(
            ks, [1.0, 10.0, 1e2, 1e3, 1e4, 1e5], [0.1, 0.05, 0.01, 0.005, 0.001], [0.1, 0.01, 0.001, 0.0001]
        )
    )
    rows = [(combos[i % len(combos)], i % n_splits) for i in range(n)]
    return Members(
        split=[s for _, s in rows],
        seed=[s for _, s in rows],
        k=[c[0] for c, _ in rows],
        l2_C=[c[1] for c, _ in rows],
        lr=[c[2] for c, _ in rows],
        delta=[c[3] for c, _ in rows],
    )


def arguments(parser) -> None:
    parser.add_argument("--dataset", default="australian")
    parser.add_argument("--members", type=int, default=5280, help="population size (5280 = the STk grid x 4 splits)")
    parser.add_argument("--loop-members", type=int, default=12)
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--preset", default="full", help="configs/preset/<preset>.yaml: batch size, eval_every")
    parser.add_argument("--out-dir", default=str(ROOT / "results" / "bench"))


def measure(args) -> Measured:
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from topklab.engine import Engine
    from topklab.engine.aggregates import build_aggregate
    from topklab.engine.functional_optim import Adagrad
    from topklab.engine.objective import Objective, TrainingModule
    from topklab.engine.population import Gathered, Grouped, Metric, PopulationExecutor
    from topklab.engine.stacked import StackedMLP
    from topklab.losses import Logistic, STk
    from topklab.models import MLP
    from topklab.tasks import TabularTask
    from topklab.tasks.metrics import TASK_METRIC

    torch.set_num_threads(os.cpu_count() or 1)

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        dataset = instantiate(compose("train", overrides=[f"dataset={args.dataset}"]).dataset)
    preset = OmegaConf.load(ROOT / "configs" / "preset" / f"{args.preset}.yaml")
    splits = [dataset.splits(s) for s in range(args.splits)]
    members = grid_members(args.members, args.splits)
    task = splits[0].task

    start = time.perf_counter()
    loop_steps = 0
    engine = Engine(
        epochs=args.epochs,
        batch_size=preset.batch_size,
        drop_last=True,
        eval_every_steps=preset.eval_every,
        validate_at_start=True,
        patience=None,
        min_delta=preset.min_delta,
        final_splits=("train", "val", "test"),
        device="cpu",
        checkpoint=False,
        resume=False,
        progress=False,
    )
    for m in range(args.loop_members):
        torch.manual_seed(members.seed[m])
        model, loss = MLP(splits[0].n_features), STk(members.k[m], delta=members.delta[m])
        module = TrainingModule(model, Objective(Logistic(), loss, l2_C=members.l2_C[m]))
        optimizer = torch.optim.Adagrad(module.parameters(), lr=members.lr[m])
        summary = engine.fit(module, optimizer, splits[members.split[m]], TabularTask(task), members.seed[m])
        loop_steps += summary["steps"]
    loop_rate = loop_steps / (time.perf_counter() - start)
    loop_rss = peak_rss_mb()

    rates = {}
    for layout in (Gathered, Grouped):
        executor = PopulationExecutor(
            build_aggregate("stk"),
            Logistic(),
            StackedMLP(splits[0].n_features),
            Adagrad(),
            Metric(*TASK_METRIC[task], higher_is_better=False),
            max_epochs=args.epochs,
            batch_size=preset.batch_size,
            eval_every=preset.eval_every,
            patience=None,
            min_delta=preset.min_delta,
            layout=layout,
        )
        start = time.perf_counter()
        result = executor.fit(splits, members)
        seconds = time.perf_counter() - start
        rates[layout.__name__] = (int(result["steps"].sum()) / seconds, peak_rss_mb(), seconds)

    phases = [
        {"executor": "per-model engine", "members": args.loop_members, "model_steps_per_s": loop_rate, "peak_rss_mb": loop_rss},
        *(
            {"executor": f"population ({name.lower()})", "members": args.members, "model_steps_per_s": rate,
             "peak_rss_mb": rss, "seconds": seconds}
            for name, (rate, rss, seconds) in rates.items()
        ),
    ]  # fmt: skip
    for phase in phases:
        print(f"{phase['executor']:<24} {phase['members']:6d} members {phase['model_steps_per_s']:12.0f} model-steps/s")
    speedup = rates["Gathered"][0] / loop_rate
    payload = {
        "phases": phases,
        "training_rows": len(splits[0].y_train),
        "batch_size": preset.batch_size,
        "eval_every": preset.eval_every,
        "threads": torch.get_num_threads(),
        "speedup": speedup,
    }
    settings = {k: getattr(args, k) for k in ("dataset", "members", "loop_members", "splits", "epochs", "preset")}
    return Measured(
        f"population_{args.dataset}_cpu", payload, settings, Path(args.out_dir), summary=f"speedup: {speedup:.1f}"
    )


def render(result: dict) -> str:
    """The rates table of a stored result."""
    out, config = result["result"], result["config"]
    lines = [
        f"# The population executor against the per-model engine ({config['dataset']})",
        "",
        f"Produced by `{result['command']}`: {out['training_rows']:,} training rows, {config['epochs']} epoch(s), batch "
        f"{out['batch_size']}, validation every {out['eval_every']} steps (preset {config['preset']}), no early "
        f"stopping, {out['threads']} torch threads; members: the STk grid over {config['splits']} splits.",
        "",
        "| executor | members | model-steps/s | peak RSS (MB) |",
        "|---|---|---|---|",
        *(
            f"| {p['executor']} | {p['members']:,} | {p['model_steps_per_s']:,.0f} | {p['peak_rss_mb']:,.0f} |"
            for p in out["phases"]
        ),
        "",
        f"speedup (gathered population / per-model engine): {out['speedup']:.1f}",
    ]
    return "\n".join(lines) + "\n"
