"""Translation on the one engine, end to end on tiny corpora the tests write: every IWSLT14 / WMT17
/ Multi30k row smoke-runs, λ trains, checkpoints average, a killed run resumes exactly, clipping
bounds the step, and bad input is one line."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT, filed_table
from helpers.translation_files import write_hub_copy, write_text_corpus
from topklab.config import config_groups
from topklab.engine.build import build
from topklab.engine.loop import average_states
from topklab.engine.objective import TrainingModule
from topklab.engine.run import build_run, train

TINY_MODEL = [
    "model.d_model=16",
    "model.ffn_dim=32",
    "model.heads=2",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "dataset.vocab_size=48",
    "engine.eval_batch_size=64",
    "engine.progress=false",
    "logger=none",
    "task.search.beam=2",
    "task.search.max_len_a=0",
    "task.search.max_len_b=4",
    "task.val_search.max_len_a=0",
    "task.val_search.max_len_b=4",
]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpora")
    return {
        "iwslt14": write_text_corpus(base / "iwslt14", stems=("train", "valid", "test"), bpe_marker="@@ "),
        "multi30k": write_text_corpus(base / "multi30k"),
        "wmt17": write_hub_copy(base / "wmt17"),
        "spm": base / "spm",
    }


def tiny(corpora, dataset: str) -> list[str]:
    holdout = ["dataset.val_holdout=24"] if dataset == "wmt17" else []
    return [*TINY_MODEL, f"dataset.root={corpora[dataset]}", f"dataset.vocab_dir={corpora['spm']}", *holdout]


def translation_rows():
    return [
        row
        for row in config_groups(ROOT / "configs")["experiment"]
        if row.split("/")[:2] in (["stk", "iwslt14"], ["stk", "wmt17"], ["stk", "multi30k"])
    ]


def test_every_translation_table_cell_has_a_row():
    rows = set(translation_rows())
    for dataset in ("iwslt14", "wmt17"):  # Table 5's two BLEU columns and Table 8's δ rows
        assert {
            f"stk/{dataset}/{r}" for r in ("average", "atk", "stk", "delta_0_1", "delta_0_05", "delta_0_005")
        } <= rows
    assert {f"stk/multi30k/{r}" for r in ("average", "atk", "stk")} <= rows


@pytest.mark.parametrize("row", translation_rows())
def test_translation_row_composes_and_smoke_runs_offline(compose_cfg, tmp_path, corpora, row):
    dataset = row.split("/")[1]
    result = tmp_path / "results" / "translation" / dataset / "row" / "seed0.json"
    cfg = compose_cfg(
        f"experiment={row}",
        *tiny(corpora, dataset),
        "engine.max_steps=2",
        "engine.batch_size=128",
        f"result_file={result}",
    )
    assert cfg.recipe == "translation" and cfg.task._target_.endswith("TranslationTask")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    written = json.loads(result.read_text())
    assert written["family"] == "translation" and written["experiment"] == f"{filed_table(dataset, summary)}/row"
    assert not {"root", "vocab_dir", "cache_dir"} & set(written["config"]["dataset"])  # no machine paths
    test = written["result"]["summary"]["metrics"]["test"]
    assert len(test["translations"]) == summary["data"]["sizes"]["test"] and "tok:13a" in test["bleu_signature"]
    assert 0 <= test["bleu"] <= 100 and test["loss"] > 0


def test_lambda_trains_and_the_last_epochs_are_averaged(compose_cfg, tmp_path, corpora):
    cfg = compose_cfg(
        "experiment=stk/multi30k/stk",
        *tiny(corpora, "multi30k"),
        "result_file=null",
        "engine.epochs=3",
        "engine.batch_size=256",
        "engine.average_last=2",
        "engine.select_metrics=[loss,bleu]",
    )
    summary = train(cfg, tmp_path / "run")
    history = summary["history"]
    assert summary["lambda"] != 0.0 and len({row["lambda"] for row in history}) == 3
    assert summary["averaged"]["epochs"] == [2, 3] and set(summary["averaged"]) == {"epochs", "val", "test"}
    assert summary["selection"]["loss"]["val"] == min(row["val_loss"] for row in history)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").rglob("epoch*.pt"))
    assert kept == ["epoch2.pt", "epoch3.pt"]
    assert all(row["losses_per_s"] > row["images_per_s"] > 0 for row in history)  # tokens vs sentences


@pytest.mark.slow
def test_a_longer_run_learns_the_dictionary_task(compose_cfg, tmp_path, corpora):
    cfg = compose_cfg(
        "experiment=stk/multi30k/stk",
        *tiny(corpora, "multi30k"),
        "result_file=null",
        "engine.epochs=6",
        "engine.batch_size=256",
        "model.d_model=32",
        "model.ffn_dim=64",
        "model.dropout=0.0",
        "optim.lr=1e-2",
        "engine.schedule.warmup_steps=10",
        "task.search.max_len_a=1.2",
        "task.val_search.max_len_a=1.2",
    )
    history = train(cfg, tmp_path / "run")["history"]
    assert history[-1]["val_loss"] < history[0]["val_loss"] - 1.0
    assert history[-1]["val_bleu"] > history[0]["val_bleu"] + 2


def test_average_states_is_the_mean_of_float_entries():
    states = [
        {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)},
    ]
    averaged = average_states(states)
    assert torch.equal(averaged["w"], torch.tensor([2.0, 4.0])) and int(averaged["n"]) == 5


@pytest.mark.parametrize("clip", [0.001, 0.0])
def test_gradient_clipping_bounds_an_sgd_step(compose_cfg, corpora, clip):
    cfg = compose_cfg(
        "experiment=stk/multi30k/average",
        *tiny(corpora, "multi30k"),
        "result_file=null",
        "optim=sgd",
        "optim.lr=1.0",
        f"engine.clip_grad_norm={clip}",
        "engine.max_steps=1",
        "engine.batch_size=128",
        "engine.schedule.name=constant",
        "engine.checkpoint=false",
        "engine.average_last=0",
    )
    data, model, objective, task, engine = build_run(cfg)
    module = TrainingModule(model, objective)
    before = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
    engine.fit(module, build(cfg.optim, "optim")(module.parameter_groups()), data, task, cfg.seed)
    step = torch.cat([p.detach().flatten().cpu() for p in module.parameters()]) - before  # fit may move it to CUDA
    assert (float(step.norm()) <= 1.001e-3) == bool(clip)  # SGD at lr 1 moves by the (clipped) gradient


def train_command(tmp_path, corpora, *extra):
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "experiment=stk/multi30k/stk",
        *tiny(corpora, "multi30k"),
        "engine.epochs=3",
        "engine.batch_size=128",
        "engine.checkpoint_every=1",
        f"paths.log_dir={tmp_path}/logs",
        *extra,
    ]


def test_killed_translation_run_resumes_to_exactly_the_uninterrupted_metrics(compose_cfg, tmp_path, corpora):
    """The uninterrupted reference trains in this process at one thread, as the killed and resumed processes run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = tmp_path / "reference.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(compose_cfg(*train_command(tmp_path / "a", corpora, f"result_file={reference}")[2:]), tmp_path / "a")
    finally:
        torch.set_num_threads(threads)
    steps_per_epoch = json.loads(reference.read_text())["result"]["summary"]["steps"] // 3
    interrupted = tmp_path / "interrupted.json"
    command = train_command(tmp_path / "b", corpora, f"result_file={interrupted}")
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        found = list((tmp_path / "b" / "logs" / "checkpoints").glob("*/run.json"))
        if found and json.loads(found[0].read_text())["step"] >= steps_per_epoch + 2:  # inside epoch 2
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    resumed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a = json.loads(reference.read_text())["result"]["summary"]
    b = json.loads(interrupted.read_text())["result"]["summary"]
    assert b["metrics"] == a["metrics"] and b["lambda"] == a["lambda"] and b["steps"] == a["steps"]


@pytest.mark.parametrize(
    "breakage,overrides,message",
    [
        ("missing", [], "not found"),
        ("uneven", [], "has 240 lines but"),
        (None, ["engine.batch_size=8"], "smaller than the longest sentence pair"),
        (None, ["dataset.pair=fr-en"], "language pair fr-en is not in this corpus"),
    ],
)
def test_bad_translation_input_is_one_line_exit_2_and_leaves_nothing(
    run_cli, tmp_path, corpora, breakage, overrides, message
):
    """train.py's command line in this process (``run_cli``; ``test_train.py`` runs it as a process)."""
    root = write_text_corpus(tmp_path / "corpus")
    if breakage == "missing":
        (root / "val.de").unlink()
    elif breakage == "uneven":
        (root / "train.en").write_text("one line\n" * 239)
    result_file = tmp_path / "result.json"
    command = [*train_command(tmp_path, corpora), f"dataset.root={root}", f"result_file={result_file}", *overrides]
    code, _, err = run_cli(*command[2:])  # the arguments after python train.py
    assert code == 2, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0], err
    assert not result_file.exists()
    assert not [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]


def test_translation_table_renders_ours_beside_the_paper_and_names_missing_rows(compose_cfg, tmp_path, corpora):
    import yaml

    from topklab.report.schema import read_results
    from topklab.report.translation import render_translation

    for seed in (0, 1):
        result = tmp_path / "results" / "translation" / "iwslt14" / "average" / f"seed{seed}.json"
        train(
            compose_cfg(
                "experiment=stk/iwslt14/average",
                *tiny(corpora, "iwslt14"),
                "engine.epochs=1",
                "engine.batch_size=128",
                "engine.amp=none",
                "engine.average_last=0",
                "engine.device=cpu",  # a run on a GPU is filed in its own table, iwslt14_cuda
                f"seed={seed}",
                f"result_file={result}",
            ),
            tmp_path / f"run{seed}",
        )
    papers = [yaml.safe_load((ROOT / "results" / "paper" / "stk_neurips2024.yaml").read_text())]
    text = render_translation(read_results(tmp_path / "results" / "translation", "translation"), papers)["iwslt14.md"]
    assert "**Still missing:** atk, stk, delta_0_1, delta_0_05, delta_0_005" in text
    average = next(line for line in text.splitlines() if line.startswith("| Average |"))
    assert average.split(" | ")[1] == "2" and average.rstrip(" |").endswith("35.27") and " ± " in average
    assert "| 1 | " in text and "Average val BLEU" in text
