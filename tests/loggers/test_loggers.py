import csv

import pytest

from topklab.engine.run import train
from topklab.loggers import CSVLogger, WandbLogger


def test_wandb_mode_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert WandbLogger().resolved_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbLogger().resolved_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert WandbLogger().resolved_mode() == "disabled"
    assert WandbLogger(mode="offline").resolved_mode() == "offline"


def test_wandb_offline_run_is_written_and_finished(compose_cfg, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    run = tmp_path / "run"
    summary = train(compose_cfg("dataset=appendicitis", "engine.epochs=1", "logger=wandb", "logger.mode=offline"), run)
    assert summary["logger_id"]
    assert list((run / "wandb").glob("offline-run-*"))
    assert wandb.run is None  # finish() was called, so the next sweep job starts a fresh run


def test_csv_logger_appends_rows(tmp_path):
    logger = CSVLogger("log.csv")
    logger.start(tmp_path, {})
    logger.log({"step": 1, "val_score": -3.0})
    logger.log({"step": 2, "val_score": -2.0})
    logger.close()
    rows = list(csv.DictReader(open(tmp_path / "log.csv")))
    assert [r["step"] for r in rows] == ["1", "2"]
