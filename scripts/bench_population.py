"""Model-steps per second of the population trainer against the plain per-model loop, same work.

    .venv/bin/python scripts/bench_population.py [--dataset australian] [--preset full] [--members 1320]

Both train the same kind of member (2-layer MLP, AdaGrad, STk; batch size and validation interval
from configs/preset/<preset>.yaml) for the same number of epochs with early stopping disabled, so
every member does the same steps. The loop times ``--loop-members`` members one by one; the
population trains ``--members`` at once (the STk grid spread over ``--splits`` splits).
Prints both rates, peak RSS after each phase, and last the ratio as ``speedup: N``.
"""
from __future__ import annotations

import argparse
import itertools
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from topklab.losses import Logistic, STk  # noqa: E402
from topklab.models import MLP  # noqa: E402
from topklab.population import Members, PopulationTrainer  # noqa: E402
from topklab.train.tabular import TabularTrainer, trainable_parameters  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def grid_members(n: int, n_splits: int) -> Members:
    ks = [1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    combos = list(itertools.product(ks, [1.0, 10.0, 1e2, 1e3, 1e4, 1e5], [0.1, 0.05, 0.01, 0.005, 0.001],
                                    [0.1, 0.01, 0.001, 0.0001]))
    rows = [(combos[i % len(combos)], i % n_splits) for i in range(n)]
    return Members(split=[s for _, s in rows], seed=[s for _, s in rows], k=[c[0] for c, _ in rows],
                   l2_C=[c[1] for c, _ in rows], lr=[c[2] for c, _ in rows], delta=[c[3] for c, _ in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="australian")
    parser.add_argument("--members", type=int, default=5280, help="population size (5280 = the STk grid x 4 splits)")
    parser.add_argument("--loop-members", type=int, default=12)
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--preset", default="full", help="configs/preset/<preset>.yaml: batch size, eval_every")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        dataset = instantiate(compose("train", overrides=[f"dataset={args.dataset}"]).dataset)
    preset = OmegaConf.load(ROOT / "configs" / "preset" / f"{args.preset}.yaml")
    splits = [dataset.splits(s) for s in range(args.splits)]
    members = grid_members(args.members, args.splits)
    no_stop = dict(max_epochs=args.epochs, batch_size=preset.batch_size, eval_every=preset.eval_every,
                   patience=10**9, min_delta=preset.min_delta)

    start = time.perf_counter()
    loop_steps = 0
    for m in range(args.loop_members):
        torch.manual_seed(members.seed[m])
        model, loss = MLP(splits[0].n_features), STk(members.k[m], delta=members.delta[m])
        optimizer = torch.optim.Adagrad(trainable_parameters(model, loss), lr=members.lr[m])
        trainer = TabularTrainer(l2_C=members.l2_C[m], **no_stop)
        result = trainer.fit(model, Logistic(), loss, optimizer, splits[members.split[m]],
                             torch.Generator().manual_seed(members.seed[m]))
        loop_steps += result["steps"]
    loop_rate = loop_steps / (time.perf_counter() - start)
    loop_rss = peak_rss_mb()

    start = time.perf_counter()
    result = PopulationTrainer("stk", Logistic(), **no_stop).fit(splits, members)
    pop_seconds = time.perf_counter() - start
    pop_rate = int(result["steps"].sum()) / pop_seconds

    print(f"dataset {args.dataset}: {len(splits[0].y_train)} training rows, {args.epochs} epochs, batch "
          f"{preset.batch_size}, validation every {preset.eval_every} steps (preset {args.preset}), "
          f"{torch.get_num_threads()} threads")
    print(f"per-model loop : {args.loop_members:6d} members {loop_rate:12.0f} model-steps/s  peak RSS {loop_rss:8.0f} MB")
    print(f"population     : {args.members:6d} members {pop_rate:12.0f} model-steps/s  peak RSS {peak_rss_mb():8.0f} MB"
          f"  ({pop_seconds:.1f} s)")
    print(f"speedup: {pop_rate / loop_rate:.1f}")


if __name__ == "__main__":
    sys.exit(main())
