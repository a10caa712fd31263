"""topklab.report: the result envelope, the converter of old result files, the cell store on
converted cells, and the figures redrawn from the committed results."""

import json
import sys

import pytest

from helpers import ROOT
from topklab.protocol import Cell, CellStore
from topklab.protocol.cell import COMMITTED_LOSS
from topklab.protocol.store import stored_cell_identity
from topklab.report import make_result, read_result, read_results, write_result
from topklab.utils.errors import TopklabError

sys.path.insert(0, str(ROOT / "scripts"))
import convert_results  # noqa: E402

RESULTS = ROOT / "results"


def one_line_error(call, *args) -> str:
    with pytest.raises(TopklabError) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_make_result_checks_its_input():
    result = make_result(
        "vision",
        "fmnistlt/la",
        {"table": "fmnistlt", "row": "la", "label": "LA", "summary": {}},
        "python train.py",
        {"seed": 0},
        {"git": {}},
    )
    assert list(result) == ["schema", "family", "experiment", "command", "config", "provenance", "result"]
    assert "choose one of: tabular, synthetic, vision, translation, language_modeling, bench" in one_line_error(
        make_result, "tabular2", "x", {}, "python x", {}, {}
    )
    assert "experiment must be a non-empty str" in one_line_error(make_result, "bench", "", {}, "python x", {}, {})
    assert "config must be a dict, got None" in one_line_error(make_result, "bench", "x", {}, "python x", None, {})
    assert "needs the payload key(s) ['label', 'summary']" in one_line_error(
        make_result, "vision", "t/r", {"table": "t", "row": "r"}, "python x", {}, {}
    )


def test_read_result_names_what_is_wrong_and_how_to_fix_it(tmp_path):
    path = tmp_path / "bench" / "r.json"
    write_result(path, make_result("bench", "r", {"x": 1}, "python x", {}, {}))
    assert read_result(path)["result"] == {"x": 1} and read_results(tmp_path, "bench")[0]["experiment"] == "r"
    assert "is a bench result where a vision result was expected" in one_line_error(read_result, path, "vision")
    path.write_text('{"results": [], "command": "python x"}')  # an old-format bench file
    assert "scripts/convert_results.py" in one_line_error(read_result, path)
    path.write_text(json.dumps({**make_result("bench", "r", {}, "python x", {}, {}), "schema": 2}))
    assert "has schema 2, this code reads schema 1" in one_line_error(read_result, path)
    path.write_text("{broken")
    assert "r.json is corrupt" in one_line_error(read_result, path)
    assert read_results(tmp_path / "nothing") == []


def test_every_committed_result_is_in_the_envelope():
    converted, current = convert_results.convert(RESULTS, check=True)
    assert converted == [] and current == len(list(RESULTS.rglob("*.json")))
    families = {r["family"] for r in read_results(RESULTS)}
    assert (
        {"tabular", "synthetic", "vision", "bench"}
        <= families
        <= {"tabular", "synthetic", "vision", "translation", "language_modeling", "bench"}
    )
    assert not (RESULTS / "synthetic" / "table1.json").exists() and read_result(
        RESULTS / "bench" / "table1.json", "bench"
    )


def old_tree(root):
    """One file of each older shape."""
    files = {
        "tabular/p/table3/d/logistic-stk.json": {
            "cell": {"table": "table3", "dataset": "d", "individual": "logistic", "aggregate": "stk"},
            "fingerprint": {"protocol": {"n_splits": 2}},
            "metric": "error_pct",
            "selected": {"k": 1},
            "test_mean": 1.0,
            "test_std": 0.5,
            "per_split": {"test": [0.5, 1.5]},
            "combos": {"k": [1]},
            "preset": "p",
            "command": "python scripts/reproduce_tabular.py",
            "provenance": {"git": {"sha": "a"}},
        },
        "synthetic/table2.json": {
            "experiment": "table2",
            "columns": {},
            "order": [],
            "seconds": 1.5,
            "command": "python scripts/reproduce_synthetic.py",
            "config": {"repeats": 2},
            "provenance": {"git": {"sha": "b"}},
        },
        "synthetic/table1.json": {
            "n": 10,
            "k": 5,
            "runs": 2,
            "threads": 1,
            "algorithms": {},
            "order": [],
            "command": "python scripts/table1_topk_time.py",
            "provenance": {},
        },
        "vision/fmnistlt/la/seed0.json": {
            "command": "python train.py",
            "config": {"row": "LA", "seed": 0},
            "summary": {"metrics": {}},
            "provenance": {},
        },
        "bench/loader_cpu.json": {"results": [], "ratio": 2.0, "images": 10, "command": "python b", "provenance": {}},
    }
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(content))
    return files


def test_convert_copies_every_value_moves_table1_and_is_idempotent(tmp_path, capsys):
    old = old_tree(tmp_path)
    assert convert_results.main(["--results", str(tmp_path), "--check"]) == 1
    assert convert_results.main(["--results", str(tmp_path)]) == 0
    cell = read_result(tmp_path / "tabular/p/table3/d/logistic-stk.json", "tabular")
    assert cell["experiment"] == "table3/d/logistic/stk" and cell["config"] == {"protocol": {"n_splits": 2}}
    assert cell["result"]["test_mean"] == 1.0 and "fingerprint" not in cell["result"]
    table2 = read_result(tmp_path / "synthetic/table2.json", "synthetic")
    assert table2["experiment"] == "table2" and table2["result"] == {"columns": {}, "order": [], "seconds": 1.5}
    table1 = read_result(tmp_path / "bench/table1.json", "bench")
    assert not (tmp_path / "synthetic/table1.json").exists()
    assert table1["config"] == {"n": 10, "k": 5, "runs": 2, "threads": 1}
    assert table1["result"] == {"algorithms": {}, "order": []}
    run = read_result(tmp_path / "vision/fmnistlt/la/seed0.json", "vision")
    assert run["result"] == {"table": "fmnistlt", "row": "la", "label": "LA", "summary": {"metrics": {}}}
    assert run["config"] == old["vision/fmnistlt/la/seed0.json"]["config"]
    loader = read_result(tmp_path / "bench/loader_cpu.json", "bench")
    assert loader["config"] == {"images": 10} and loader["result"] == {"results": [], "ratio": 2.0}
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.json")}
    capsys.readouterr()
    assert convert_results.main(["--results", str(tmp_path)]) == 0
    assert "0 file(s) converted, 5 already in the envelope" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.json")} == before


def test_convert_refuses_an_unknown_file(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.json").write_text("{}")
    assert convert_results.main(["--results", str(tmp_path)]) == 2
    assert "is no result file this script knows" in capsys.readouterr().err


def test_the_store_resumes_from_converted_cells_and_writes_them_unchanged(tmp_path):
    cell = Cell("table3", "australian", "logistic", "stk")
    committed = CellStore(RESULTS / "tabular" / "fraction")
    record = committed.load(cell)
    assert record["preset"] == "fraction" and record["test_mean"] == pytest.approx(11.560693641618496)
    fingerprint = {**record["fingerprint"], "loss": COMMITTED_LOSS["stk"]}  # stored before the loss entered it
    recorded = stored_cell_identity(record)  # this machine as the one that stored it
    assert committed.differences(record, cell, fingerprint, recorded) == []
    changed = {**fingerprint, "protocol": {**fingerprint["protocol"], "max_epochs": 1}}
    assert committed.differences(record, cell, changed, recorded) == ["config protocol.max_epochs"]
    copy = CellStore(tmp_path)
    assert copy.save(record).read_bytes() == committed.path(cell).read_bytes()
    assert copy.load(cell) == record
    with pytest.raises(TopklabError, match=r"needs \['provenance'\] before it is stored"):
        copy.save({k: v for k, v in record.items() if k != "provenance"})


def test_committed_figures_are_redrawn_pixel_for_pixel(tmp_path):
    """`make figures` reproduces results/figures/*.png from results/ (compared as pixels, not bytes)."""
    import matplotlib.image as image
    import numpy as np

    from topklab.report.cli import render_figures

    written = render_figures(RESULTS, tmp_path)
    assert sorted(written) == sorted(p.name for p in (RESULTS / "figures").glob("*.png"))
    for name in written:
        ours, committed = image.imread(tmp_path / name), image.imread(RESULTS / "figures" / name)
        assert ours.shape == committed.shape and np.array_equal(ours, committed), f"{name} differs"


def test_a_result_records_its_command_without_one_machines_folders(tmp_path):
    checkpoints = f"paths.checkpoint_dir={tmp_path / 'ckpt'}"
    provenance = {"argv": [str(tmp_path / "train.py"), "seed=0", checkpoints], "git": {}}
    result = make_result("bench", "t", {"order": []}, "python train.py paths.data_dir=/data/x seed=0", {}, provenance)
    assert result["command"] == "python train.py paths.data_dir=<path> seed=0"
    assert result["provenance"]["argv"] == ["train.py", "seed=0", "paths.checkpoint_dir=<path>"]
    assert provenance["argv"][-1] == checkpoints  # the caller's dict is left alone


@pytest.mark.integration  # every committed result read
def test_committed_results_name_no_absolute_path_in_their_commands():
    for path in sorted((ROOT / "results").rglob("*.json")):
        text = path.read_text()
        if '"command"' not in text:
            continue
        result = json.loads(text)
        arguments = [result.get("command", ""), *result.get("provenance", {}).get("argv", [])]
        assert not [a for a in arguments if "=/" in a or a.startswith("/")], path
