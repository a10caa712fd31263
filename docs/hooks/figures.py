"""MkDocs hook: the site serves ``results/figures/*.png`` (drawn by ``make figures`` from ``results/``
alone) as ``figures/<name>.png``, so a page under docs/ embeds one as ``![caption](figures/<name>.png)``
and the strict build checks that it exists."""

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "results"


def on_files(files, config):
    for png in sorted((RESULTS / "figures").glob("*.png")):
        files.append(File(f"figures/{png.name}", str(RESULTS), config["site_dir"], config["use_directory_urls"]))
    return files
