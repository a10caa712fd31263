"""A result's identity covers the data it read and Hydra's env_set, and the committed results stay
reproducible: each documented command (the Makefile's reproduce targets) passes the result guard
for every committed result it would write, with nothing written."""

import gzip
import json
import re

import numpy as np
import pytest
import torch

from helpers import ROOT
from topklab.data.fingerprint import DOCUMENTED_DATA
from topklab.engine.result_guard import chosen_experiment, result_path, row_filing
from topklab.engine.run import data_fingerprint, plan_result
from topklab.utils.errors import DataUnavailableError

FAMILIES = {  # a family's documented command: its Makefile target
    "vision/fmnistlt": "reproduce-fmnistlt",
    "vision/sinkhorn_beta": "reproduce-sinkhorn-beta",
    "sparsification": "reproduce-sparsification",
    "translation/multi30k": "reproduce-multi30k",
    "routing (language modelling)": "reproduce-routing",
}
ROW = ROOT / "results" / "vision" / "fmnistlt" / "la_stk" / "seed0.json"


def documented_command(target: str) -> list[str]:
    """The overrides of a Makefile target's ``train.py -m`` line, its variables' defaults filled in."""
    makefile = (ROOT / "Makefile").read_text()
    defaults = dict(re.findall(r"^(\w+) \?= (\S+)$", makefile, flags=re.M))
    line = re.search(rf"^{re.escape(target)}:.*\n\t(.*)$", makefile, flags=re.M).group(1)
    line = re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), m.group(0)), line)
    return [word.strip("'") for word in line.split("train.py -m", 1)[1].split()]


def jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep line: each experiment its glob matches times each seed."""
    pattern = next(o for o in overrides if o.startswith("experiment=")).split("=", 1)[1]
    folder = re.fullmatch(r"glob\((.+)/\*\)", pattern).group(1)
    rows = sorted(
        p.stem for p in (ROOT / "configs" / "experiment" / folder).glob("*.yaml") if not p.stem.startswith("_")
    )
    seeds = next(o for o in overrides if o.startswith("seed=")).split("=", 1)[1].split(",")
    rest = [o for o in overrides if not o.startswith(("experiment=", "seed=", "hydra"))]  # the launcher: Hydra's
    return [[f"experiment={folder}/{row}", f"seed={seed}", *rest] for row in rows for seed in seeds]


def as_stored_machine(monkeypatch, stored: dict) -> None:
    """This process as the machine that stored ``stored``: its thread count and CPU kernels."""
    hardware = stored["provenance"]["hardware"]
    torch.set_num_threads(hardware["torch_threads"])
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: hardware["torch_cpu_capability"])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_documented_command_passes_the_guard_of_its_committed_results(family, compose_cfg, tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    checked = 0
    try:
        for overrides in jobs(documented_command(FAMILIES[family])):
            cfg = compose_cfg(*overrides)
            try:
                fingerprint = data_fingerprint(cfg)
            except DataUnavailableError as err:
                pytest.skip(f"the documented data is not here: {err}")
            committed = result_path(cfg.paths.root_dir, row_filing(cfg.result, chosen_experiment(overrides)), cfg.seed)
            if not committed.is_file():
                continue
            stored = json.loads(committed.read_text())
            as_stored_machine(monkeypatch, stored)
            path, _ = plan_result(cfg, overrides, tmp_path / "run", fingerprint)  # refused: a TopklabError
            assert path == committed and fingerprint == DOCUMENTED_DATA[stored["result"]["summary"]["dataset"]]
            checked += 1
    finally:
        torch.set_num_threads(threads)
    assert checked >= 4, f"{family}: only {checked} committed results checked"


def label_shuffled_fashion_mnist(root):
    """``root/fashion-mnist``: the documented files, the training labels permuted."""
    source = ROOT / ".data" / "fashion-mnist" / "usr" / "share" / "datasets" / "fashion-mnist"
    if not source.is_dir():
        pytest.skip(f"the documented Fashion-MNIST is not at {source} (make data)")
    folder = root / "fashion-mnist"
    folder.mkdir(parents=True)
    for path in source.glob("*-ubyte.gz"):
        (folder / path.name).symlink_to(path)
    labels = folder / "train-labels-idx1-ubyte.gz"
    raw = gzip.decompress(labels.read_bytes())
    labels.unlink()
    shuffled = np.random.default_rng(0).permutation(np.frombuffer(raw, dtype=np.uint8, offset=8))
    labels.write_bytes(gzip.compress(raw[:8] + shuffled.tobytes()))
    return root


@pytest.mark.parametrize(
    "override, refusal",
    [
        ("paths.data_dir=<shuffled>", r"data e608646a6e8893d6 → [0-9a-f]{16}"),
        ("+hydra.job.env_set.ONEDNN_MAX_CPU_ISA=AVX2", r"environment \{\} → \{'ONEDNN_MAX_CPU_ISA': 'AVX2'\}"),
    ],
)
def test_other_data_or_an_env_set_variable_is_refused_before_training(
    override, refusal, run_cli, tmp_path, monkeypatch
):
    """``python train.py experiment=fmnistlt/la_stk seed=0`` with either: one line, exit 2, nothing written."""
    stored = json.loads(ROW.read_text())
    override = override.replace("<shuffled>", str(label_shuffled_fashion_mnist(tmp_path / "data")))
    before = ROW.read_bytes()
    threads = torch.get_num_threads()
    as_stored_machine(monkeypatch, stored)
    monkeypatch.setattr("topklab.engine.run.build_run", lambda cfg: pytest.fail("the guard let it train"))
    try:
        code, _, err = run_cli(
            "experiment=fmnistlt/la_stk",
            "seed=0",
            override,
            f"hydra.run.dir={tmp_path}/run",
            f"paths.log_dir={tmp_path}",
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 2 and re.search(rf"holds a result with other settings \({refusal}\).*force_result=true", err), err
    assert len(err.strip().splitlines()) == 1 and ROW.read_bytes() == before and not (tmp_path / "run").exists()
