"""Render the Multi30k rows run on the H200 (results/translation/multi30k_cuda/ beside this file) with the
project's own translation renderer; they stay out of results/ because the GPU machine's .git was the
checkout's commit with later fixes uncommitted on top (their envelopes say dirty).
    PYTHONPATH=src python experiments/device_runs/h200_2026-11-26/render_multi30k_cuda.py"""

from pathlib import Path

import yaml

from topklab.report.schema import read_results
from topklab.report.translation import render_translation
from topklab.utils.io import atomic_write_text

here = Path(__file__).parent
papers = [yaml.safe_load(p.read_text()) for p in sorted(Path("results/paper").glob("*.yaml"))]
for name, text in render_translation(read_results(here / "results" / "translation", "translation"), papers).items():
    atomic_write_text(here / name, text)
    print(f"wrote {here / name}")
