"""MkDocs hook: the site serves ``results/figures/*.png`` (drawn by ``make figures`` from ``results/``
alone) as ``figures/<name>.png``, so a page under docs/ embeds one as ``![caption](figures/<name>.png)``
and the strict build checks that it exists; and the rendered tables ``results/tables/*.md`` (``make
tables``) and benchmarks ``results/bench/*.md`` as the pages ``tables/<name>.md`` and ``bench/<name>.md``,
outside the navigation, so a page links a table as ``[fmnistlt_full_k.md](tables/fmnistlt_full_k.md)``
and the strict build checks that link too."""

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "results"


def on_files(files, config):
    for png in sorted((RESULTS / "figures").glob("*.png")):
        files.append(File(f"figures/{png.name}", str(RESULTS), config["site_dir"], config["use_directory_urls"]))
    for folder in ("tables", "bench"):
        for table in sorted((RESULTS / folder).glob("*.md")):
            files.append(File(f"{folder}/{table.name}", str(RESULTS), config["site_dir"], config["use_directory_urls"]))
    return files
