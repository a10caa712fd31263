"""Write results/tables/table{3,4,6}.md and .tex from stored cells, table{1,2}.md from
results/synthetic/table{1,2}.json, and <table>.md for each vision table with runs under
results/vision/<table>/ (fmnistlt, petersen_cifar100, stk_cifar100lt). Numbers come only from
results/; the vision rows' labels and order come from experiments/vision/<table>/*.yaml.

    python scripts/make_tables.py [--preset quick] [--results results] [--out results/tables]

Each table lists the paper's value, ours (mean ± std over the preset's splits), the difference,
a mark where ours lies within the paper's std, and paired Wilcoxon tests of STk against the
baselines of its row. Missing cells print as "—" and are listed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import json

import yaml

from topklab.protocol.store import CellStore
from topklab.protocol.tables import build_lines, paired_tests, render_latex, render_markdown
from topklab.synthetic.tables import render_table1, render_table2
from topklab.train.classification_tables import load_table, render_vision_table
from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_write_text

TABLES = ("table3", "table4", "table6")
VISION_PAPER = {"petersen_cifar100": ("petersen_icml2022.yaml", "petersen_cifar100"),
                "stk_cifar100lt": ("stk_neurips2024.yaml", "table5")}


def vision_rows(experiments: Path, table: str) -> tuple[list[str], dict[str, str]]:
    """Row names in file order and their labels (the ``row:`` field) from the experiment configs."""
    files = sorted(p for p in (experiments / table).glob("*.yaml") if not p.stem.startswith("_"))
    labels = {p.stem: (yaml.safe_load(p.read_text()) or {}).get("row") or p.stem for p in files}
    return [p.stem for p in files], labels


def render_vision_tables(results: Path, experiments: Path) -> dict[str, str]:
    rendered = {}
    for directory in sorted(p for p in (results / "vision").glob("*") if p.is_dir()):
        rows = load_table(directory)
        if not rows:
            continue
        order, labels = vision_rows(experiments, directory.name)
        paper = None
        if directory.name in VISION_PAPER:
            file, key = VISION_PAPER[directory.name]
            paper = yaml.safe_load((results / "paper" / file).read_text())[key]
        rendered[f"{directory.name}.md"] = render_vision_table(directory.name, rows, labels, order, paper)
    return rendered


def header_for(preset: str, records: list[dict], lines) -> list[str]:
    commands = sorted({r.get("command", "?") for r in records})
    shas = sorted({str((r.get("provenance") or {}).get("git", {}).get("sha", "?"))[:10] for r in records})
    splits = sorted({len(r["per_split"]["test"]) for r in records})
    missing = [f"{x.dataset}/{x.individual}/{x.aggregate}" for x in lines if x.ours is None]
    within = [x.within_paper_std for x in lines if x.within_paper_std is not None]
    out = [f"Preset `{preset}`: {', '.join(map(str, splits))} splits per cell; code {', '.join(shas)}.",
           f"Produced by: {'; '.join(f'`{c}`' for c in commands)}, then `python scripts/make_tables.py --preset {preset}`.",
           f"Ours within the paper's std: {sum(within)} of {len(within)} cells."]
    if missing:
        out.append(f"Missing cells ({len(missing)}): {', '.join(missing)}.")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick", help="results/tabular/<preset>/ to read")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/tables")
    parser.add_argument("--experiments", type=Path, default=Path(__file__).resolve().parents[1] / "experiments" / "vision",
                        help="row labels and order of the vision tables")
    args = parser.parse_args(argv)
    out_dir = args.out or args.results / "tables"
    try:
        paper_file = args.results / "paper" / "stk_neurips2024.yaml"
        if not paper_file.exists():
            raise TopklabError(f"{paper_file} is missing; restore it from git")
        paper = yaml.safe_load(paper_file.read_text())
        store = CellStore(args.results / "tabular" / args.preset)
        records = store.records()
        if not records:
            raise TopklabError(f"no cells under {store.root}; run `python scripts/reproduce_tabular.py "
                               f"preset={args.preset}` first (or pick another --preset)")
        rendered = {}
        for table in TABLES:
            lines = build_lines(table, paper, records)
            tests = paired_tests(table, records)
            table_records = [r for r in records if r["cell"]["table"] == table]
            header = header_for(args.preset, table_records, lines) if table_records else [
                f"Preset `{args.preset}`: no cells of this table yet."]
            rendered[f"{table}.md"] = render_markdown(table, paper, lines, tests, header)
            rendered[f"{table}.tex"] = render_latex(table, paper, lines, tests, header)
        for name, render in (("table1", render_table1), ("table2", render_table2)):
            source = args.results / "synthetic" / f"{name}.json"
            if source.exists():
                try:
                    rendered[f"{name}.md"] = render(json.loads(source.read_text()), paper)
                except (ValueError, KeyError) as err:
                    raise TopklabError(f"{source} is corrupt ({err!r}); rerun the script that wrote it") from None
            else:
                print(f"note: {source} not found; {name}.md not written (see scripts/README.md)")
        rendered.update(render_vision_tables(args.results, args.experiments))
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, text in rendered.items():
        atomic_write_text(out_dir / name, text)
    print(f"wrote {', '.join(sorted(rendered))} to {out_dir} from {len(records)} cells of preset {args.preset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
