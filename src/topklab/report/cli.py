"""Write every table and figure from ``results/`` only (never trains).

    python -m topklab.report tables [--preset quick] [--results results] [--out results/tables]
    python -m topklab.report figures [--results results] [--out results/figures]

``tables``: Tables 3, 4, 6 (.md, .tex) from the tabular cells of one preset, Table 1 from
``bench/table1.json``, Table 2 from ``synthetic/table2.json``, ``<table>.md`` for every vision
table under ``vision/`` and every translation table under ``translation/`` (paper values from
``paper/*.yaml``), and ``routing.md`` / ``gradient_sparsification.md`` from ``routing/``,
``sparsification/`` and their benchmarks. ``figures``: Figures 2-4 (Figures 3 and 4 from
``synthetic/figure{3,4}.json``), ``routing.png``, ``gradient_sparsification.png`` and the pictures beside the
tables (:func:`render_charts`). A missing optional source is skipped with a note; a
corrupt or old-format result is a one-line error and nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

from topklab.losses.aggregate.lambda_rules import PAPER as PAPER_RULE
from topklab.report.experiments import render_index
from topklab.report.layer import plot_routing, plot_sparsification, render_routing, render_sparsification
from topklab.report.paired import sweep_points, table_groups, with_gpu_table
from topklab.report.schema import dirty_result_files, read_result, read_results
from topklab.report.synthetic import column_band, render_table1, render_table2
from topklab.report.tabular import LAMBDA_AGGREGATES, PAPER_PRESET, TABLES, band_of, render_tabular, table_stem
from topklab.report.translation import render_translation, test_bleu
from topklab.report.vision import by_table, render_vision, selected_test, top1
from topklab.utils.errors import TopklabError
from topklab.utils.io import atomic_write_text

PAPER = "stk_neurips2024.yaml"


@dataclass(frozen=True)
class Source:
    """One optional result file under ``results/`` and the command that writes it."""

    path: str
    family: str
    producer: str


TABLE1 = Source("bench/table1.json", "bench", "scripts/table1_topk_time.py")
TABLE2S = {
    "table2.md": Source("synthetic/table2.json", "synthetic", "scripts/reproduce_synthetic.py"),
    "table2_intended.md": Source(
        "synthetic/table2_intended.json",
        "synthetic",
        "scripts/reproduce_synthetic.py experiments=[table2] task.covariance=intended suffix=_intended",
    ),
    "table2_scale_atk.md": Source(
        "synthetic/table2_scale_atk.json",
        "synthetic",
        "scripts/reproduce_synthetic.py experiments=[table2,figure4] scale=atk suffix=_scale_atk",
    ),
}
LAYER_BENCH = {
    "routing": Source("bench/routing_cpu.json", "bench", "python -m benchmarks routing"),
    "sparsification": Source("bench/sparsification_cpu.json", "bench", "python -m benchmarks sparsification"),
}
CHART_SOURCES = {
    "topk_cpu": Source("bench/topk_cpu.json", "bench", "python -m benchmarks topk --device cpu"),
    "topk_cuda": Source("bench/topk_cuda.json", "bench", "python -m benchmarks topk --device cuda"),
    "tracked_cuda": Source("bench/tracked_cuda.json", "bench", "python -m benchmarks tracked_cuda"),
    "operators_cpu": Source("bench/operators_cpu.json", "bench", "python -m benchmarks operators --device cpu"),
}
FIGURE_SOURCES = {
    name: Source(f"synthetic/{name}.json", "synthetic", "scripts/reproduce_synthetic.py")
    for name in ("figure3", "figure4", "figure4_scale_atk")
}


def _paper(results: Path) -> dict:
    path = results / "paper" / PAPER
    if not path.exists():
        raise TopklabError(f"{path} is missing; restore it from git")
    return yaml.safe_load(path.read_text())


def _optional(results: Path, source: Source, what: str) -> dict | None:
    path = results / source.path
    if not path.exists():
        print(f"note: {path} not found; {what} not written (run {source.producer})")
        return None
    return read_result(path, source.family)


# λ in band per full-preset cell and Table 2 column
BAND = Source("bench/lambda_band_cpu.json", "bench", "scripts/lambda_band.py")


Renderer = Callable[[], dict[str, str]]


def refuse_dirty(results: Path, allow_dirty: bool) -> None:
    """A one-line error if a result under ``results`` came from a tree with uncommitted changes (unless allowed)."""
    dirty = dirty_result_files(results)
    if dirty and not allow_dirty:
        raise TopklabError(
            f"{len(dirty)} result(s) under {results} came from a tree with uncommitted changes "
            f"(first: {dirty[0]}); rerun them from a clean checkout, or pass --allow-dirty "
            f"(the tables then mark them DIRTY)"
        )


def reference_cells(results: Path, preset: str, cells: list[dict]) -> list[dict] | None:
    """The ``full`` preset's cells for a preset whose cells train λ by another rule than the paper's (the
    protocol's ``lam_update``, e.g. ``full_solve``), which its tables compare against; None otherwise."""
    rules = {
        (r.get("config") or {}).get("protocol", {}).get("lam_update")
        for r in cells
        if r["result"]["cell"]["aggregate"] in LAMBDA_AGGREGATES
    }
    if preset == PAPER_PRESET or not rules - {None, PAPER_RULE}:
        return None
    return read_results(results / "tabular" / PAPER_PRESET, "tabular")


def table_renderers(results: Path, preset: str | None = None) -> dict[str, Renderer]:
    """``{table name: a function returning {file name: text}}`` for every table that ``results`` has the data
    for. A table's name is its files' stem: ``table3`` writes ``table3.md`` and ``table3.tex``,
    ``fmnistlt_full`` writes ``fmnistlt_full.md``. Listing them reads the results and renders the cheap
    tables (vision, translation, the layer tables); Tables 3, 4 and 6, whose paired tests take most of
    `make tables`' time, render only when their function is called.

    Parameters
    ----------
    results : the results directory (reads only there)
    preset : which ``tabular/<preset>/`` cells make Tables 3, 4 and 6 (they must exist); None: every preset stored

    Examples
    --------
    >>> sorted(table_renderers(Path("results")))[:3]  # doctest: +SKIP
    ['fmnistlt', 'fmnistlt_full', 'fmnistlt_full_k']
    """
    paper = _paper(results)
    stored = (
        sorted(p.name for p in (results / "tabular").iterdir() if p.is_dir()) if (results / "tabular").is_dir() else []
    )
    band = _optional(results, BAND, "λ band")
    renderers: dict[str, Renderer] = {}
    for name in [preset] if preset else stored:
        cells = read_results(results / "tabular" / name, "tabular")
        if not cells:
            raise TopklabError(
                f"no cells under {results / 'tabular' / name}; run `make reproduce-tabular PRESET={name}` "
                "first (or pick another --preset)"
            )
        reference = reference_cells(results, name, cells)
        for table in TABLES:
            renderers[table_stem(table, name)] = partial(
                render_tabular, name, paper, cells, band_of(band, name), (table,), reference
            )
    if not renderers:
        raise TopklabError(f"no cells under {results / 'tabular'}; run `make reproduce-tabular` first")
    table1 = _optional(results, TABLE1, "table1.md")
    if table1 is not None:
        renderers["table1"] = lambda: {"table1.md": render_table1(table1, paper)}
    for name, source in TABLE2S.items():
        result = _optional(results, source, name)
        if result is not None:
            column = column_band(band, Path(source.path).stem)
            renderers[Path(name).stem] = partial(lambda n, r, c: {n: render_table2(r, paper, c)}, name, result, column)
    papers = [yaml.safe_load(p.read_text()) for p in sorted((results / "paper").glob("*.yaml"))]
    cheap = {
        **render_vision(read_results(results / "vision", "vision"), papers, results.parent / "configs"),
        **render_translation(read_results(results / "translation", "translation"), papers, results.parent / "configs"),
        **render_layer_tables(results),
    }
    for file, text in cheap.items():
        renderers[Path(file).stem] = partial(dict, {file: text})
    return renderers


def render_tables(results: Path, preset: str | None = None, allow_dirty: bool = False) -> dict[str, str]:
    """``{file name: text}`` of every table that ``results`` has the data for.

    Parameters
    ----------
    results : the results directory (reads only there)
    preset : which ``tabular/<preset>/`` cells make Tables 3, 4 and 6 (they must exist); None: every preset
        stored (``full``, the paper's protocol, as ``table3.md`` ...; the others as ``table3_<preset>.md`` ...)
    allow_dirty : render results that came from a tree with uncommitted changes (their headers say
        so); by default any such result under ``results`` is a one-line error

    Examples
    --------
    >>> sorted(render_tables(Path("results"), "fraction"))[:3]  # doctest: +SKIP
    ['fmnistlt.md', 'table1.md', 'table2.md']
    """
    refuse_dirty(results, allow_dirty)
    rendered: dict[str, str] = {}
    for render in table_renderers(results, preset).values():
        rendered.update(render())
    return rendered


def table_stem_of(name: str) -> str:
    """The table a ``--table`` argument names: ``fmnistlt_full``, ``fmnistlt_full.md`` and
    ``results/tables/table3.tex`` name ``fmnistlt_full``, ``fmnistlt_full`` and ``table3``.

    Examples
    --------
    >>> table_stem_of("fmnistlt_full.md"), table_stem_of("results/tables/table3.tex"), table_stem_of("table1")
    ('fmnistlt_full', 'table3', 'table1')
    """
    path = Path(name)
    return path.stem if path.suffix in (".md", ".tex") else path.name


def render_layer_tables(results: Path) -> dict[str, str]:
    """``routing.md`` and ``gradient_sparsification.md`` where their runs or benchmarks exist."""
    configs, rendered = results.parent / "configs", {}
    for name, folder, family, render in (
        ("routing.md", "routing", "language_modeling", render_routing),
        ("gradient_sparsification.md", "sparsification", "vision", render_sparsification),
    ):
        runs = read_results(results / folder, family) if (results / folder).is_dir() else []
        bench = (
            read_result(results / LAYER_BENCH[folder].path, "bench")
            if (results / LAYER_BENCH[folder].path).exists()
            else None
        )
        if runs or bench:
            rendered[name] = render(runs, bench, configs)
    return rendered


def render_figures(results: Path, out: Path) -> list[str]:
    """Draw Figures 2-4 into ``out``; return the names written (a figure without its result is skipped).

    Examples
    --------
    >>> render_figures(Path("results"), Path("/tmp/figures"))  # doctest: +SKIP
    ['figure2.png', 'figure3.png', 'figure4.png']
    """
    from topklab.report.figures import figure2, figure3, figure4  # matplotlib and torch only here

    paper = _paper(results)
    sources = {name: _optional(results, source, f"{name}.png") for name, source in FIGURE_SOURCES.items()}
    skipped = {name for name, result in sources.items() if result is None}
    draw = {
        "figure2": figure2,
        "figure3": lambda path: figure3(sources["figure3"], path),
        "figure4": lambda path: figure4(sources["figure4"], paper, path),
        "figure4_scale_atk": lambda path: figure4(sources["figure4_scale_atk"], paper, path),
    }
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (n for n in draw if n not in skipped):
        tmp = out / f".{name}.tmp.png"
        draw[name](tmp)
        tmp.replace(out / f"{name}.png")
        written.append(f"{name}.png")
    routing = read_results(results / "routing", "language_modeling") if (results / "routing").is_dir() else []
    if routing:
        plot_routing(routing, out / "routing.png")
        written.append("routing.png")
    if (results / LAYER_BENCH["sparsification"].path).exists():
        plot_sparsification(
            read_result(results / LAYER_BENCH["sparsification"].path, "bench"), out / "gradient_sparsification.png"
        )
        written.append("gradient_sparsification.png")
    return written + render_charts(results, out)


def render_charts(results: Path, out: Path) -> list[str]:
    """Draw the pictures beside the result tables into ``out`` (see :mod:`topklab.report.charts`): λ
    against the k-th loss and the per-seed strips of every translation and vision table with several
    seeds, a k sweep's paired difference from its baseline against k (``k_sweep_<table>.png``, once a
    swept row has a result paired with the baseline's), the routed share per layer, cost against n and
    the operators' times; return the names written (a picture without its results is skipped).

    Examples
    --------
    >>> render_charts(Path("results"), Path("/tmp/figures"))[:2]  # doctest: +SKIP
    ['lambda_multi30k.png', 'seeds_multi30k.png']
    """
    from topklab.report import charts  # matplotlib only here

    drawn = {}
    for folder, metric, unit in (
        ("translation", test_bleu, "test sacreBLEU"),
        ("vision", lambda r: selected_test(r["result"]["summary"], "top1"), "test top-1 accuracy (%)"),
    ):
        for table, rows in by_table(read_results(results / folder, folder)).items():
            if charts.lambda_rows(rows):
                drawn[f"lambda_{table}.png"] = partial(charts.lambda_against_kth, rows, table)
            if max(map(len, rows.values())) > 1:
                drawn[f"seeds_{table}.png"] = partial(charts.seed_strips, rows, metric, unit, table)
    for folder, value, what, unit in (
        ("vision", top1, "test top-1", "points"),
        ("translation", test_bleu, "test sacreBLEU", "BLEU"),
    ):
        tables = by_table(read_results(results / folder, folder))
        for group, settings in table_groups(results.parent / "configs", folder).items():
            for table in with_gpu_table(group, tables):
                points = sweep_points(settings, tables.get(table, {}), value) if settings.get("baseline") else {}
                if any(p["pairs"] for series in points.values() for p in series):
                    baseline = settings["rows"][settings["baseline"]]["label"]
                    device = charts.device_of([r for runs in tables.get(table, {}).values() for r in runs])
                    drawn[f"k_sweep_{table}.png"] = partial(
                        charts.difference_against_k, points, baseline, table, what, unit, device
                    )
    for table, rows in by_table(read_results(results / "routing", "language_modeling")).items():
        if charts.routed_shares(rows):
            drawn[f"routing_layers_{table}.png"] = partial(charts.routed_share_per_layer, rows, table)
    sources = {name: _optional(results, source, f"{name} in a figure") for name, source in CHART_SOURCES.items()}
    topk = {
        title: sources[f"topk_{device}"]
        for device, title in (("cpu", "CPU"), ("cuda", "GPU"))
        if sources[f"topk_{device}"]
    }
    if topk or sources["tracked_cuda"]:
        drawn["cost_against_n.png"] = partial(charts.cost_against_n, topk, sources["tracked_cuda"])
    if sources["operators_cpu"]:
        drawn["operators.png"] = partial(charts.operator_times, sources["operators_cpu"])
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in drawn.items():
        tmp = out / f".{name}.tmp.png"
        draw(tmp)
        tmp.replace(out / name)
    return list(drawn)


def _results_dir() -> Path:
    return Path(os.environ.get("TOPKLAB_ROOT", ".")) / "results"


def tables(argv: list[str] | None = None) -> int:
    """``python -m topklab.report tables``: write results/tables/; 0, or 2 after a one-line error."""
    parser = argparse.ArgumentParser(prog="python -m topklab.report tables", description=tables.__doc__)
    parser.add_argument("--preset", default=None, help="only results/tabular/<preset>/ (default: every preset stored)")
    parser.add_argument("--results", type=Path, default=_results_dir())
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/tables")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="render results from a tree with uncommitted changes"
    )
    parser.add_argument(
        "--table",
        default=None,
        help="render this table alone, by its file's name with or without .md (table3: table3.md and table3.tex)",
    )
    args = parser.parse_args(argv)
    out = args.out or args.results / "tables"
    try:
        rendered = (
            one_table(args.results, table_stem_of(args.table), args.preset, args.allow_dirty)
            if args.table
            else render_tables(args.results, args.preset, args.allow_dirty)
        )
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, text in rendered.items():
        atomic_write_text(out / name, text)
    cells = "" if args.table else f" (tabular cells of {f'preset {args.preset}' if args.preset else 'every preset'})"
    print(f"wrote {', '.join(sorted(rendered))} to {out}{cells}")
    return 0


def one_table(results: Path, table: str, preset: str | None = None, allow_dirty: bool = False) -> dict[str, str]:
    """``{file name: text}`` of the one table ``table`` (a stem, :func:`table_stem_of`); an unknown name is a
    one-line error listing the names."""
    refuse_dirty(results, allow_dirty)
    renderers = table_renderers(results, preset)
    if table not in renderers:
        raise TopklabError(f"no table {table!r} under {results}; the tables: {', '.join(sorted(renderers))}")
    return renderers[table]()


def figures(argv: list[str] | None = None) -> int:
    """``python -m topklab.report figures``: write results/figures/; 0, or 2 after a one-line error."""
    parser = argparse.ArgumentParser(prog="python -m topklab.report figures", description=figures.__doc__)
    parser.add_argument("--results", type=Path, default=_results_dir())
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/figures")
    args = parser.parse_args(argv)
    out = args.out or args.results / "figures"
    try:
        written = render_figures(args.results, out)
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def index(argv: list[str] | None = None) -> int:
    """``python -m topklab.report index``: write experiments/INDEX.md from configs/experiment/; 0."""
    parser = argparse.ArgumentParser(prog="python -m topklab.report index", description=index.__doc__)
    root = Path(os.environ.get("TOPKLAB_ROOT", "."))
    parser.add_argument("--configs", type=Path, default=root / "configs")
    parser.add_argument("--out", type=Path, default=root / "experiments" / "INDEX.md")
    args = parser.parse_args(argv)
    atomic_write_text(args.out, render_index(args.configs))
    print(f"wrote {args.out}")
    return 0


COMMANDS = {"tables": tables, "figures": figures, "index": index}


def main(argv: list[str] | None = None) -> int:
    """``python -m topklab.report {tables,figures,index} [options]``.

    Examples
    --------
    >>> main(["tables", "--preset", "fraction"])  # doctest: +SKIP
    0
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"error: give a command first: {' or '.join(COMMANDS)} (then --help for its options)", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
