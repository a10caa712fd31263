"""A trial run cannot overwrite a row's committed result."""

import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT
from topklab.data.fingerprint import DOCUMENTED_DATA
from topklab.engine.result_guard import (
    changed_settings,
    destination,
    read_stored,
    refusal,
    stored_differences,
    stored_identity,
)
from topklab.engine.run import train
from topklab.engine.run_identity import identity
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import NUMERICS_ENVIRONMENT


def test_only_row_seed_launcher_paths_and_logger_keep_a_row_s_settings():
    own = [
        "experiment=fmnistlt/la_stk",
        "seed=3",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "logger=none",
        "paths.data_dir=/data",
        "recipe=multiclass",
        "engine.progress=false",
        "force_result=true",
    ]
    assert changed_settings(own) == []
    assert changed_settings(own + ["engine.epochs=1", "loss.k=0.5", "+extra=1"]) == [
        "engine.epochs=1",
        "loss.k=0.5",
        "+extra=1",
    ]


def test_destination(tmp_path):
    row = tmp_path / "results" / "vision" / "fmnistlt" / "la_stk" / "seed0.json"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert destination(str(row), str(tmp_path), ["seed=0"], tmp_path / "run", cpu) == (row, None)
    path, note = destination(str(row), str(tmp_path), ["engine.epochs=1"], tmp_path / "run", cpu)
    assert path == tmp_path / "run" / "result.json" and "engine.epochs=1 changes the row's settings" in note
    path, note = destination(str(row), str(tmp_path), [], tmp_path / "run", cuda)
    assert path == tmp_path / "results" / "vision" / "fmnistlt_cuda" / "la_stk" / "seed0.json" and "cuda" in note
    elsewhere = tmp_path / "mine.json"
    assert destination(str(elsewhere), str(tmp_path), ["engine.epochs=1"], tmp_path / "run", cpu) == (elsewhere, None)


def _tabular_row(compose_cfg, tmp_path, *overrides):
    result = tmp_path / "results" / "vision" / "t" / "r" / "seed0.json"
    cfg = compose_cfg(
        "dataset=wisconsin",
        "logger=none",
        f"paths.root_dir={tmp_path}",
        f"paths.data_dir={ROOT}/.data",
        f"result_file={result}",
        *overrides,
    )
    return cfg, result


def test_a_trial_run_writes_beside_and_a_different_result_needs_force(compose_cfg, tmp_path, capsys):
    cfg, result = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1")
    train(cfg, tmp_path / "trial", overrides=["engine.epochs=1"])
    assert not result.exists() and (tmp_path / "trial" / "result.json").is_file()
    assert "changes the row's settings" in capsys.readouterr().out
    train(cfg, tmp_path / "own", overrides=[])
    stored = result.read_bytes()
    other, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=2")
    with pytest.raises(
        TopklabError, match=r"holds a result with other settings \(config engine.epochs\).*force_result=true"
    ):
        train(other, tmp_path / "refused", overrides=[])
    assert result.read_bytes() == stored and not (tmp_path / "refused").exists()
    checked, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=2", "check_result=true")
    capsys.readouterr()
    train(checked, tmp_path / "checked", overrides=["check_result=true"])
    own = json.loads((tmp_path / "checked" / "result.json").read_text())["result"]
    assert result.read_bytes() == stored and own["compared_with"]["path"] == str(result)
    assert f"result: differs from {result} in " in capsys.readouterr().out and own["compared_with"]["differences"]
    again, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1", "check_result=true")
    train(again, tmp_path / "same", overrides=["check_result=true"])  # nothing differs: the row's own file
    assert (
        json.loads(result.read_text())["result"]["summary"]["metrics"]
        == json.loads(stored)["result"]["summary"]["metrics"]
    )
    forced, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=2", "force_result=true")
    train(forced, tmp_path / "forced", overrides=["force_result=true"])
    replaced = json.loads(result.read_text())
    assert replaced["config"]["engine"]["epochs"] == 2
    assert replaced["result"]["replaced"]["metrics"] == json.loads(stored)["result"]["summary"]["metrics"]


def test_another_thread_count_is_another_identity(tmp_path):
    path = tmp_path / "seed0.json"
    path.write_text(
        json.dumps(
            {
                "config": {"a": 1},
                "provenance": {"hardware": {"torch_threads": 64}},
                "result": {"summary": {"device": "cpu"}},
            }
        )
    )
    mine = identity(torch.device("cpu"), None)
    assert f"threads 64 → {mine['threads']}" in stored_differences(read_stored(path, False), {"a": 1}, mine)
    for corrupt in ("{not json", "[]"):
        path.write_text(corrupt)
        with pytest.raises(TopklabError, match="not a readable result.*force_result=true"):
            read_stored(path, force=False)
        assert "unreadable" in read_stored(path, force=True)  # what force replaces


def test_train_py_passes_its_overrides(tmp_path):
    """The command line decides: a trial override keeps results/ clean (a wrong result_file row in the repo is untouched)."""
    result = tmp_path / "results" / "vision" / "t" / "r" / "seed0.json"
    out = subprocess.run(
        [
            sys.executable,
            "train.py",
            "dataset=wisconsin",
            "engine.epochs=1",
            "logger=none",
            f"paths.root_dir={tmp_path}",
            f"paths.data_dir={ROOT}/.data",
            f"paths.log_dir={tmp_path}/logs",
            f"result_file={result}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "engine.epochs=1" in out.stdout and not result.exists()


def test_every_make_reproduce_target_keeps_the_row_s_settings():
    """The Makefile's train.py lines override only the row, seed, launcher and paths: their results go to results/."""
    lines = [line for line in (ROOT / "Makefile").read_text().splitlines() if "train.py -m" in line]
    assert len(lines) >= 8
    for line in lines:
        words = line.split("train.py -m", 1)[1].replace("\\", " ").split()
        overrides = [w.strip("'") for w in words if "=" in w]
        assert changed_settings(overrides) == [], line


@pytest.mark.parametrize("variable", sorted(NUMERICS_ENVIRONMENT))
def test_a_kernel_choosing_environment_variable_is_part_of_a_results_identity(variable, monkeypatch):
    """A committed result (stored before the environment was recorded: under none of its variables) is
    accepted under its own code, torch and machine, and refused, in one line naming the variable, under one of them."""
    for name in NUMERICS_ENVIRONMENT:  # this process as the recording one: under none of them
        monkeypatch.delenv(name, raising=False)
    path = ROOT / "results" / "vision" / "fmnistlt" / "la_stk" / "seed0.json"
    stored = json.loads(path.read_text())
    recorded = stored_identity(stored)
    machine = ("code", "torch", "packages", "threads", "cpu_capability", "cpu_isa")
    mine = {**identity(torch.device("cpu"), DOCUMENTED_DATA["fmnistlt"]), **{k: recorded[k] for k in machine}}
    assert stored_differences(stored, stored["config"], mine) == []
    monkeypatch.setenv(variable, "AVX2")
    differences = stored_differences(
        stored, stored["config"], {**mine, "environment": identity(torch.device("cpu"), None)["environment"]}
    )
    assert differences == [f"environment {{}} → {{'{variable}': 'AVX2'}}"]
    assert "\n" not in str(refusal(path, differences))


def test_a_resume_under_another_environment_is_refused_and_an_older_checkpoint_ran_under_none(monkeypatch):
    from topklab.engine.run_identity import check_resumable, segment_identity  # noqa: PLC0415

    for name in NUMERICS_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    current = segment_identity(torch.device("cpu"), None)
    older = {key: value for key, value in current.items() if key != "environment"}  # written before the field
    check_resumable(older, current, "ckpt", force=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with pytest.raises(TopklabError, match="environment {} → {'ONEDNN_MAX_CPU_ISA': 'AVX2'}"):
        check_resumable(older, segment_identity(torch.device("cpu"), None), "ckpt", force=False)


def test_the_reproducibility_page_lists_every_kernel_choosing_variable():
    page = (ROOT / "docs" / "reproducibility.md").read_text()
    assert [name for name in NUMERICS_ENVIRONMENT if f"| `{name}` |" not in page] == []


def test_a_rerun_under_an_equal_identity_never_rewrites_the_stored_result(compose_cfg, tmp_path, capsys, monkeypatch):
    """Reproduced bit for bit: the stored file is kept as it is. Numbers that differ under an equal identity
    (what the identity cannot see, here an edit patched in after the code was hashed): the stored file is
    kept and this run's result goes into its own folder, saying so. check_result=true compares whatever is
    stored, into the run's folder."""
    from topklab.losses import Logistic

    cfg, result = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1")
    train(cfg, tmp_path / "first", overrides=[])
    stored = result.read_bytes()
    capsys.readouterr()
    train(cfg, tmp_path / "again", overrides=[])
    assert result.read_bytes() == stored and f"result: reproduces {result} bit for bit" in capsys.readouterr().out
    checked, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1", "check_result=true")
    train(checked, tmp_path / "checked", overrides=["check_result=true"])
    assert json.loads((tmp_path / "checked" / "result.json").read_text())["result"]["compared_with"]["identical"]
    forward = Logistic.forward
    monkeypatch.setattr(Logistic, "forward", lambda self, *args: forward(self, *args) * 1.5)
    train(cfg, tmp_path / "other", overrides=[])
    out = capsys.readouterr().out
    assert result.read_bytes() == stored and f"result: differs from {result}" in out
    assert f"{result} is kept; this run's result is {tmp_path / 'other' / 'result.json'}" in out
    assert not json.loads((tmp_path / "other" / "result.json").read_text())["result"]["compared_with"]["identical"]


def test_force_replaces_a_corrupt_stored_result_and_records_it(compose_cfg, tmp_path):
    cfg, result = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1")
    result.parent.mkdir(parents=True)
    result.write_text("[]")
    with pytest.raises(TopklabError, match="not a readable result .*force_result=true"):
        train(cfg, tmp_path / "refused", overrides=[])
    forced, _ = _tabular_row(compose_cfg, tmp_path, "engine.epochs=1", "force_result=true")
    train(forced, tmp_path / "forced", overrides=["force_result=true"])
    assert "not an object" in json.loads(result.read_text())["result"]["replaced"]["unreadable"]


def test_a_result_resumed_under_several_identities_is_none_of_them(tmp_path):
    segment = {**identity(torch.device("cpu"), None), "from_step": 0}
    stored = {
        "config": {"a": 1},
        "provenance": {"hardware": {}},
        "result": {"summary": {"segments": [{**segment, "threads": 64}, {**segment, "from_step": 5, "forced": True}]}},
    }
    differences = stored_differences(stored, {"a": 1}, identity(torch.device("cpu"), None))
    threads = ", ".join(sorted({str(segment["threads"]), "64"}))  # each segment's, as JSON text in order
    assert differences == [f"threads several ({threads}) → {segment['threads']}"], differences
    lacking = {**stored, "result": {"summary": {"segments": [{**segment, "code": None}, segment]}}}
    assert any(d.startswith("code several (") for d in stored_differences(lacking, {"a": 1}, segment))
