"""What several test folders share: the repository's paths, the tabular dataset names, writers of tiny
files in the real formats (:mod:`helpers.vision_files`, :mod:`helpers.translation_files`,
:mod:`helpers.embedding_files`) and the fixtures and references more than one test module uses
(:mod:`helpers.vision_runs`, :mod:`helpers.population`, :mod:`helpers.tables`).

``tests/`` is on ``sys.path`` (pyproject's ``[tool.pytest.ini_options] pythonpath``), so a test in any
folder imports these as ``from helpers import ROOT`` or ``from helpers.vision_files import ...``."""

import importlib
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
CONFIG_DIR = ROOT / "configs"
FIXTURES = TESTS / "fixtures"
TABULAR_DATASETS = [
    "appendicitis",
    "australian",
    "german",
    "phoneme",
    "spambase",
    "titanic",
    "wisconsin",
    "housing",
    "abalone",
    "cpusmall",
    "sinc",
]


def filed_table(table: str, summary: dict) -> str:
    """The table a run's result is filed in: ``<table>`` on the CPU, ``<table>_<device type>`` elsewhere
    (``engine.device=auto`` takes a GPU where one is visible)."""
    device = summary["device"].split(":")[0]
    return table if device == "cpu" else f"{table}_{device}"


def load_script(name: str):
    """The module of ``scripts/<name>.py`` (scripts are no package: imported with ``scripts/`` on the path)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
