"""Record the per-step loss distributions of short real runs of every recipe that uses MATk/STk,
as replay fixtures for tests/losses/test_lambda_replay.py (:class:`topklab.losses.aggregate.loss_stream.LossStream`).

    python scripts/record_loss_streams.py                      # every recipe into tests/fixtures/loss_streams/
    python scripts/record_loss_streams.py recipes=[translation] steps=300

Recipes: translation (the Multi30k STk row), fmnistlt (the LA + STk row; the vision engine and
loss of the PEL rows, whose data and weights are not here), tabular (the australian STk cell's
selected setting on split 0, the population executor and AdaGrad) and synthetic (Table 2's STk
(SReLU) column at its selected k, repeat 0, with the trainer's Adam). Each fixture records the command, the commit and the setting.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import topklab.launch  # noqa: E402,F401  (registers Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.config import compose_run  # noqa: E402
from topklab.engine.build import build  # noqa: E402
from topklab.engine.objective import TrainingModule  # noqa: E402
from topklab.engine.run import build_run  # noqa: E402
from topklab.losses.aggregate.loss_stream import LossStream  # noqa: E402
from topklab.protocol.recording import record_cell  # noqa: E402
from topklab.synthetic.experiment import columns_of  # noqa: E402
from topklab.synthetic.recording import record_column  # noqa: E402
from topklab.utils.errors import TopklabError, fail  # noqa: E402
from topklab.utils.provenance import git_info  # noqa: E402

ENGINE_ROWS = {"translation": "stk/multi30k/stk", "fmnistlt": "fmnistlt/la_stk"}
TABULAR_CELL = "results/tabular/full/table3/australian/logistic-stk.json"
SYNTHETIC_ROW, SYNTHETIC_LABEL = "stk/table2/stk_srelu", "STk (SReLU)"


def engine_stream(row: str, steps: int, workdir: Path) -> LossStream:
    """The first ``steps`` training calls of an engine row (its own recipe, optimizer and schedule)."""
    cfg = compose_run(
        [
            f"experiment={row}",
            "logger=none",
            "result_file=null",
            f"engine.max_steps={steps}",
            "engine.checkpoint=false",
            "++engine.average_last=0",
            "engine.progress=false",
        ]
    )
    data, model, objective, task, engine = build_run(cfg)
    module = TrainingModule(model, objective)
    optimizer = build(cfg.optim, "optim")(module.parameter_groups())
    stream = LossStream(source=_source(cfg, f"experiment={row}"))
    objective.aggregate.register_forward_pre_hook(lambda module_, args: stream.add(args[0]))
    engine.final_splits = ["val"]
    engine.fit(module, optimizer, data, task, cfg.seed, workdir=None, run_dir=workdir)
    return stream


def tabular_stream(steps: int) -> LossStream:
    stream = record_cell(ROOT / TABULAR_CELL, ROOT)
    stream.source["command"] = "python scripts/record_loss_streams.py recipes=[tabular]"
    return _first(stream, steps)


def synthetic_stream(steps: int) -> LossStream:
    import json

    from hydra import compose

    cfg = compose("reproduce_synthetic")
    selected_k = json.loads((ROOT / "results/synthetic/table2.json").read_text())["result"]["columns"][SYNTHETIC_LABEL][
        "k"
    ]
    stream = record_column(cfg, columns_of([SYNTHETIC_ROW])[SYNTHETIC_LABEL], selected_k)
    stream.source["command"] = "python scripts/record_loss_streams.py recipes=[synthetic]"
    return _first(stream, steps)


def _first(stream: LossStream, steps: int) -> LossStream:
    stream.source.update(git_info(ROOT))
    stream.steps, stream.lams = stream.steps[:steps], stream.lams[:steps]
    return stream


def _source(cfg: DictConfig, row: str) -> dict:
    return {
        "command": f"python scripts/record_loss_streams.py recipes=[...] ({row})",
        "row": row,
        "loss": OmegaConf.to_container(cfg.loss, resolve=True),
        "optim": OmegaConf.to_container(cfg.optim, resolve=True),
        "schedule": OmegaConf.to_container(cfg.engine.schedule, resolve=True),
        **git_info(ROOT),
    }


@hydra.main(config_path="../configs", config_name="record_loss_streams", version_base="1.3")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(int(cfg.threads) or torch.get_num_threads())
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for recipe in cfg.recipes:
        if recipe in ENGINE_ROWS:
            stream = engine_stream(ENGINE_ROWS[recipe], int(cfg.steps), Path(cfg.paths.log_dir) / "record" / recipe)
        elif recipe == "tabular":
            stream = tabular_stream(int(cfg.steps))
        elif recipe == "synthetic":
            stream = synthetic_stream(int(cfg.steps))
        else:
            raise TopklabError(
                f"unknown recipe {recipe!r}; choose from {', '.join([*ENGINE_ROWS, 'tabular', 'synthetic'])}"
            )
        stream.source["recipe"] = recipe
        stream.save(out / f"{recipe}.json")
        print(f"{recipe}: {len(stream.steps)} calls -> {out / f'{recipe}.json'}")


if __name__ == "__main__":
    try:
        main()
    except TopklabError as err:
        fail(err)
