"""Where an experiment row's result goes: no row yaml names a file; a row's group
says what the result is (``result.family``, ``result.table``, a study's ``result.folder``), the row is
its yaml stem unless it sets ``result.row``, and :func:`~topklab.engine.result_guard.result_path`
derives ``results/<folder>/<table>/<row>/seed<k>.json``; a tabular row's cells lie in
``results/tabular/<preset>/<table>/<row>/``. Every committed result lies where its row puts it, and the
result block never enters a run key or a stored result's config."""

import json
from collections import defaultdict
from pathlib import Path, PurePosixPath

import pytest
import torch
from hydra import initialize_config_dir

from helpers import CONFIG_DIR, ROOT
from topklab.config import compose_run, config_groups
from topklab.engine.checkpoint import run_key
from topklab.engine.result_guard import FAMILIES, chosen_experiment, filed_as, result_path, row_filing
from topklab.engine.run import plan_result
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import portable_config

ROWS = [row for row in config_groups(CONFIG_DIR)["experiment"] if not PurePosixPath(row).name.startswith("_")]
STUDIES = ("routing", "sparsification")  # folders of results/ that a study keeps beside the families'
# rows whose runner is not runner=model: a tabular row's cells (one file per cell and preset), a synthetic column
RUNNER_ROWS = (
    "stk/table2/",
    "stk/table3/",
    "stk/table4/",
    "stk/table6/",
    "stk/figure3/",
    "stk/figure4/",
    "stk/synthetic/",
)
NAMED_ROWS = ("stk/table5/", "stk/table7/", "stk/table8/")  # per-dataset rows: <dataset>_<row>.yaml
RUN_FOLDERS = ("vision", "translation", *STUDIES)  # results/ folders of train.py rows


def compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose_run(list(overrides))


@pytest.fixture(scope="module")
def composed(composed_rows) -> dict:
    """``{row: composed config}`` of every row of configs/experiment/, seed 0, results under the repository
    (the test run's shared compositions, as train.py composes them)."""
    assert all(cfg.paths.root_dir == str(ROOT) for cfg in composed_rows.values())
    return {row: composed_rows[row] for row in ROWS}


@pytest.fixture(scope="module")
def filings(composed) -> dict:
    """``{row: row_filing}`` of the rows that train.py files (the others have no result block)."""
    filed = {row: row_filing(cfg.result, row) for row, cfg in composed.items()}
    return {row: filing for row, filing in filed.items() if filing is not None}


def test_no_row_yaml_names_an_output_path():
    offenders = [
        f"{path.relative_to(CONFIG_DIR)}:{number}"
        for path in sorted((CONFIG_DIR / "experiment").rglob("*.yaml"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ("result_file" in line or "results/" in line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, f"rows name output paths (derive them from the result block): {offenders}"


@pytest.mark.integration  # every row composed (the test run's shared compositions)
def test_every_row_s_path_is_derived_from_its_id_family_and_table(composed, filings):
    protocol_rows = {row for row in ROWS if composed[row].runner._target_ != "topklab.engine.run.ModelRun"}
    assert set(ROWS) - set(filings) == protocol_rows == {row for row in ROWS if row.startswith(RUNNER_ROWS)}
    for row, filing in filings.items():
        block = composed[row].result
        assert filing["family"] in FAMILIES and filing["folder"] in (filing["family"], *STUDIES), row
        assert filing["folder"] in RUN_FOLDERS, row
        stem = PurePosixPath(row).name
        named = block.row is not None
        assert not named or row.startswith(NAMED_ROWS), f"{row} names its row; only per-dataset tables do"
        expected = ROOT / "results" / block.folder / block.table / (block.row if named else stem) / "seed0.json"
        assert result_path(composed[row].paths.root_dir, filing, composed[row].seed) == expected, row
        assert composed[row].result_file == "auto", row


@pytest.mark.integration  # every row composed (the test run's shared compositions)
def test_rows_that_share_a_result_file_are_one_run(composed, filings):
    """Table 7's CLIP + PEL rows are Table 5's runs; any other two rows at one path would overwrite each other."""
    by_path = defaultdict(list)
    for row, filing in filings.items():
        by_path[result_path(ROOT, filing, 0)].append(row)
    shared = {path: rows for path, rows in by_path.items() if len(rows) > 1}
    assert shared, "Table 7's CLIP + PEL rows should share Table 5's files"
    for rows in shared.values():
        assert len({run_key(composed[row]) for row in rows}) == 1, rows


@pytest.mark.integration  # every row composed (the test run's shared compositions)
def test_every_committed_result_lies_where_its_row_puts_it(filings):
    rows_at = defaultdict(list)
    for row, filing in filings.items():
        rows_at[(filing["folder"], filing["table"], filing["row"])].append(row)
    files = sorted(p for folder in RUN_FOLDERS for p in (ROOT / "results" / folder).rglob("*.json"))
    assert len(files) >= 90
    for path in files:
        folder, table, name, seed_file = path.relative_to(ROOT / "results").parts
        rows = rows_at.get((folder, table, name))
        assert rows, f"{path.relative_to(ROOT)}: no row of configs/experiment/ files its result there"
        envelope = json.loads(path.read_text())
        assert envelope["family"] == filings[rows[0]]["family"], path
        assert (envelope["result"]["table"], envelope["result"]["row"]) == (table, name), path
        assert envelope["experiment"] == f"{table}/{name}" and seed_file == f"seed{envelope['config']['seed']}.json"


@pytest.mark.integration  # every row composed (the test run's shared compositions)
def test_every_committed_tabular_cell_lies_where_its_row_and_preset_put_it(composed):
    """The tabular rows' cells (``runner=tabular_cells``): ``tabular/<preset>/<table>/<row>/<individual>-<aggregate>.json``."""
    cells = {}
    for row, cfg in composed.items():
        if cfg.get("cells") is not None:
            assert cfg.row == PurePosixPath(row).name, row
            cells.update(
                {(cfg.cells.table, cfg.row, f"{i}-{a}"): row for i in cfg.cells.individual for a in cfg.cells.loss}
            )
    files = sorted((ROOT / "results" / "tabular").rglob("*.json"))
    assert len(files) >= 3 * 94
    for path in files:
        preset, table, row, name = path.relative_to(ROOT / "results" / "tabular").with_suffix("").parts
        assert (table, row, name) in cells, f"{path.relative_to(ROOT)}: no tabular row has this cell"
        result = json.loads(path.read_text())["result"]
        cell = result["cell"]
        assert result["preset"] == preset and (cell["table"], cell["dataset"]) == (table, row), path
        assert f"{cell['individual']}-{cell['aggregate']}" == name, path


def test_the_result_block_is_in_no_run_key_and_no_stored_config():
    cfg = compose("experiment=stk/multi30k/atk", "seed=1")
    other = compose(
        "experiment=stk/multi30k/atk", "seed=1", "result.table=elsewhere", "result.row=x", "result_file=null"
    )
    assert run_key(cfg) == run_key(other)
    assert portable_config(cfg) == portable_config(other) and "result" not in portable_config(cfg)


def test_a_row_run_plans_its_derived_file_and_its_filing(tmp_path):
    overrides = ["experiment=routing/dense", "seed=2", f"paths.root_dir={tmp_path}"]  # keep the row's own file
    path, filing, _ = plan_result(compose(*overrides, "engine.device=cpu"), overrides, tmp_path / "run", None)
    assert path == tmp_path / "results" / "routing" / "multi30k_en" / "dense" / "seed2.json"
    assert filing == {"family": "language_modeling", "table": "multi30k_en", "row": "dense"}
    named = ["experiment=stk/table8/places_lt_delta_0_05", "engine.device=cpu", f"paths.root_dir={tmp_path}"]
    path, filing, _ = plan_result(compose(*named), None, tmp_path / "run", None)  # a library call: the row names itself
    assert path == tmp_path / "results" / "vision" / "pel_places_lt" / "delta_0_05" / "seed0.json"
    assert filing == {"family": "vision", "table": "pel_places_lt", "row": "delta_0_05"}


def test_what_writes_no_result_and_what_cannot_name_its_row(tmp_path):
    row = ["experiment=fmnistlt/la_stk", "engine.device=cpu", f"paths.root_dir={tmp_path}"]
    assert plan_result(compose(*row, "result_file=null"), row[:1], tmp_path / "run", None) is None
    assert plan_result(compose("dataset=sinc", f"paths.root_dir={tmp_path}"), [], tmp_path / "run", None) is None
    with pytest.raises(TopklabError, match=r"cannot name this fmnistlt row .*pass experiment=<row>"):
        plan_result(compose(*row), None, tmp_path / "run", None)
    mine = tmp_path / "mine" / "trial" / "seed0.json"  # a library call's own file: the row's family and table
    path, filing, _ = plan_result(compose(*row, f"result_file={mine}"), None, tmp_path / "run", None)
    assert path == mine and filing == {"family": "vision", "table": "fmnistlt", "row": "trial"}


def test_a_result_block_without_its_family_or_table_is_one_line():
    for block in ({"family": "tabular", "table": "t"}, {"family": "vision", "table": None}):
        with pytest.raises(TopklabError, match="an experiment row's group sets both"):
            row_filing(block, "a/b")


def test_the_experiment_comes_from_the_last_choice_on_the_command_line():
    assert chosen_experiment(["+experiment=a/b", "experiment=c/d"]) == "c/d"
    assert chosen_experiment(["~experiment", "experiment=null"]) is None


def test_another_device_files_its_result_in_its_own_table():
    filing = {"family": "vision", "folder": "vision", "table": "fmnistlt", "row": "la"}
    assert filed_as(filing, Path("x/seed0.json"), "multiclass", torch.device("cuda"))["table"] == "fmnistlt_cuda"
    assert filed_as(None, Path("r/t/r/seed0.json"), "translation", torch.device("cpu"))["family"] == "translation"
