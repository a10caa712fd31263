"""A result's identity covers the data it read and Hydra's env_set, and the committed results stay
reproducible: each documented command (the Makefile's reproduce targets) passes the result guard
for every committed result it would write, with nothing written."""

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ROOT
from topklab.engine.run import data_fingerprint, plan_result
from topklab.utils.errors import DataUnavailableError, TopklabError
from topklab.utils.provenance import NUMERICS_ENVIRONMENT

ROW = ROOT / "results" / "vision" / "fmnistlt" / "la_stk" / "seed0.json"
EXPERIMENTS = ROOT / "configs" / "experiment"


def makefile_rows() -> dict[str, str]:
    """Every experiment row a Makefile target or ``scripts/run_sweep.py`` line runs, with that target:
    each ``experiment=glob(<folder>/*)`` (or run_sweep's ``'<folder>/*'``) and ``glob(include=[...])``
    expanded over ``configs/experiment/``."""
    makefile = (ROOT / "Makefile").read_text()
    rows = {}
    for target, recipe in re.findall(r"^([\w-]+):.*\n((?:\t.*\n)+)", makefile, flags=re.M):
        for pattern in re.findall(r"glob\(([\w/*]+)\)|run_sweep\.py '([\w/*]+)'", recipe):
            folder = (pattern[0] or pattern[1]).rstrip("/*")
            for path in sorted((EXPERIMENTS / folder).glob("*.yaml")):
                if not path.stem.startswith("_"):
                    rows.setdefault(f"{folder}/{path.stem}", target)
    return rows


def committed_jobs() -> list[tuple[str, list[str], Path]]:
    """``(target, overrides, committed file)`` of every committed ``train.py`` result: generated from the
    results tree, each file's row being the one of its stored command's rows that its folder names, which
    a Makefile target must run."""
    rows = makefile_rows()
    jobs = []
    for path in sorted(ROOT.glob("results/*/*/*/seed*.json")):
        if path.parts[-4] in ("tabular", "bench", "synthetic", "tables", "figures", "paper"):
            continue
        stored = json.loads(path.read_text())
        listed = re.search(r"experiment=(\S+)", stored["command"]).group(1).split(",")
        [experiment] = [row for row in listed if row.rsplit("/", 1)[-1] == path.parent.name]
        target = rows.get(experiment)
        assert target is not None, f"{path}: its row {experiment} is run by no Makefile target"
        jobs.append((target, [f"experiment={experiment}", f"seed={path.stem[4:]}"], path))
    return jobs


def as_stored_machine(monkeypatch, stored: dict, capability: str | None = None) -> None:
    """This process as the machine that stored ``stored``: its thread count and CPU kernels (``capability``
    instead, where given)."""
    hardware = stored["provenance"]["hardware"]
    torch.set_num_threads(hardware["torch_threads"])
    kernels = capability or hardware["torch_cpu_capability"]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: kernels)


def test_every_committed_result_is_reused_or_refused_in_one_line_under_its_documented_command(
    compose_cfg, tmp_path, monkeypatch
):
    """With the recording machine's threads and CPU kernels emulated, the documented command of every
    committed result either passes the guard into the committed file (identity equal) or is refused in
    one line naming what differs, before training; with other CPU kernels each is refused naming them."""
    threads, outcomes = torch.get_num_threads(), {"reused": 0, "refused": 0, "data absent": 0}
    try:
        for _target, overrides, committed in committed_jobs():
            cfg = compose_cfg(*overrides)
            try:
                fingerprint = data_fingerprint(cfg)
            except DataUnavailableError:
                outcomes["data absent"] += 1
                continue
            stored = json.loads(committed.read_text())
            as_stored_machine(monkeypatch, stored)
            try:
                path, _, against = plan_result(cfg, overrides, tmp_path / "run", fingerprint)
                assert path == committed and against == {}
                outcomes["reused"] += 1
            except TopklabError as error:
                message = str(error)
                assert "\n" not in message and message.startswith(
                    f"{committed} holds a result with other settings ("
                ), message
                outcomes["refused"] += 1
            other = "AVX2" if stored["provenance"]["hardware"]["torch_cpu_capability"] != "AVX2" else "AVX512"
            as_stored_machine(monkeypatch, stored, other)
            with pytest.raises(TopklabError, match=rf"cpu_capability \w+ → {other}") as error:
                plan_result(cfg, overrides, tmp_path / "run", fingerprint)
            assert "\n" not in str(error.value)
    finally:
        torch.set_num_threads(threads)
    print(outcomes)
    assert outcomes["reused"] + outcomes["refused"] >= 45, outcomes  # the fmnistlt_full results at least


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
    for name in NUMERICS_ENVIRONMENT:  # this process as the recording one: under none of them
        monkeypatch.delenv(name, raising=False)
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
    assert code == 2 and re.search(rf"holds a result with other settings \(.*{refusal}\).*force_result=true", err), err
    assert len(err.strip().splitlines()) == 1 and ROW.read_bytes() == before and not (tmp_path / "run").exists()


def committed_cell_rows() -> list[tuple[str, str]]:
    """``(preset, row)`` of every committed tabular cell's row, from ``results/tabular/`` itself."""
    found = {
        (path.parts[-4], f"stk/{path.parts[-3]}/{path.parts[-2]}")
        for path in (ROOT / "results" / "tabular").glob("*/*/*/*.json")
    }
    return sorted(found)


def first_of_each_table(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One row per preset and table: the default tier's share of :func:`committed_cell_rows`."""
    return [
        r
        for i, r in enumerate(rows)
        if i == 0 or r[0] != rows[i - 1][0] or r[1].split("/")[1] != rows[i - 1][1].split("/")[1]
    ]


@pytest.mark.parametrize(
    "every_row",
    [
        pytest.param(False, id="one row per preset and table"),
        pytest.param(True, marks=pytest.mark.slow, id="every row"),
    ],
)
def test_every_committed_cell_is_reused_or_refused_in_one_line_under_its_documented_command(
    every_row, monkeypatch, capsys
):
    """``train.py experiment=<row> preset=<preset>`` for every committed cell, the recording machine's threads
    and CPU kernels emulated (the quick and fraction cells record none: this machine's): the row's cells are
    reused (identity equal) or refused in one line naming what differs, before any training; under other CPU
    kernels the refusal names them. Nothing is trained or written."""
    from hydra import initialize_config_dir

    import topklab.protocol.reproduce as module
    from helpers import CONFIG_DIR
    from topklab.protocol.reproduce import reproduce

    monkeypatch.setattr(module, "run_cell", lambda *a, **k: pytest.fail("a committed cell was retrained"))
    threads, outcomes = torch.get_num_threads(), {"reused": 0, "refused": 0}
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            rows = committed_cell_rows() if every_row else first_of_each_table(committed_cell_rows())
            for preset, row in rows:
                [first, *_] = sorted((ROOT / "results" / "tabular" / preset / row.split("/", 1)[1]).glob("*.json"))
                hardware = json.loads(first.read_text())["provenance"]["hardware"]
                recorded = hardware.get("torch_cpu_capability") or torch.backends.cpu.get_cpu_capability()
                for capability in (recorded, "AVX2" if recorded != "AVX2" else "AVX512"):
                    torch.set_num_threads(hardware["torch_threads"])
                    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
                    setup = module.OmegaConf.create(
                        {
                            "row": row, "preset": module.OmegaConf.to_container(
                                module.compose_run([f"experiment={row}", f"preset={preset}"]).preset, resolve=True
                            ),
                            "results_dir": str(ROOT / "results" / "tabular" / preset), "aggregates": None,
                            "threads": 0, "progress": False, "config_dir": str(CONFIG_DIR),
                            "paths": {"root_dir": str(ROOT), "data_dir": str(ROOT / ".data")},
                        }
                    )  # fmt: skip
                    try:
                        reproduce(setup)
                        assert capability == recorded and " 0 to train" in capsys.readouterr().out
                        outcomes["reused"] += 1
                    except module.TopklabError as error:
                        message = str(error)
                        assert "\n" not in message and "holds a result with other settings (" in message, message
                        if capability != recorded:
                            assert f"cpu_capability {hardware.get('torch_cpu_capability', 'unrecorded')} → " in message
                        outcomes["refused"] += capability == recorded
                    monkeypatch.undo()
                    monkeypatch.setattr(module, "run_cell", lambda *a, **k: pytest.fail("retrained"))
    finally:
        torch.set_num_threads(threads)
    print(outcomes)
    assert sum(outcomes.values()) == len(rows) >= (40 if every_row else 9), outcomes


def test_other_cpu_kernels_chosen_by_aten_cpu_capability_are_refused_before_training(tmp_path):
    """``ATEN_CPU_CAPABILITY=default python train.py experiment=fmnistlt/la_stk seed=0``: torch picks its
    kernels as the process starts, so only a new process can change them; one line names them, exit 2,
    nothing written."""
    import os
    import subprocess
    import sys

    stored = json.loads(ROW.read_text())
    assert stored["provenance"]["hardware"]["torch_cpu_capability"] != "DEFAULT"
    before = ROW.read_bytes()
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "train.py", "experiment=fmnistlt/la_stk", "seed=0", f"hydra.run.dir={tmp_path}/run",
         f"paths.log_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if "not found" in done.stderr and "Fashion-MNIST" in done.stderr:
        pytest.skip(f"the documented data is not here: {done.stderr.strip()}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert f"cpu_capability {stored['provenance']['hardware']['torch_cpu_capability']} → DEFAULT" in lines[0]
    assert ROW.read_bytes() == before and not (tmp_path / "run").exists()
