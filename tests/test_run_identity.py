"""A checkpoint knows the code and machine settings that wrote it: a finished or killed run is not
resumed under other ones without ``engine.resume=force``, and every segment of a run is recorded.
Faults around a run's folders (unwritable, corrupt record, stale temporaries, a full disk) are one line."""
import pytest

import topklab.engine.loop as loop
from test_vision_engine import TINY_FMNIST, fmnist_root  # noqa: F401  (fixture)
from topklab.engine.run import train
from topklab.engine.run_identity import check_resumable, code_version
from topklab.utils.errors import TopklabError

LOSS = '''"""A loss."""
import torch


def scale(x):
    """Twice x."""
    return 2 * x
'''


def write_package(root, loss=LOSS, report="def render():\n    return 'table'\n", kernel="int f() { return 1; }\n"):
    (root / "losses").mkdir(parents=True, exist_ok=True)
    (root / "report").mkdir(exist_ok=True)
    (root / "losses" / "scale.py").write_text(loss)
    (root / "report" / "tables.py").write_text(report)
    (root / "kernel.cpp").write_text(kernel)
    return code_version(root)


def test_code_version_ignores_comments_docstrings_layout_and_reports_but_not_code(tmp_path):
    original = write_package(tmp_path / "a")
    reformatted = LOSS.replace('"""Twice x."""', '"""Twice x, documented at length."""  ').replace(
        "return 2 * x", "# doubled\n    return (2 *\n            x)")
    assert write_package(tmp_path / "b", loss=reformatted, report="def render():\n    return 'another table'\n",
                         kernel="\n  int f() { return 1; }  \n\n") == original
    assert write_package(tmp_path / "c", loss=LOSS.replace("2 * x", "3 * x")) != original
    assert write_package(tmp_path / "d", kernel="int f() { return 2; }\n") != original


def test_the_installed_code_version_is_stable_within_a_process():
    assert code_version() == code_version() and len(code_version()) == 16


def test_a_checkpoint_without_a_record_is_not_resumed_silently():
    me = {"code": "a", "device": "cpu", "threads": 1, "cpu_capability": "AVX2", "torch": "2.13.0"}
    with pytest.raises(TopklabError, match="no record of the code and machine .* engine.resume=force"):
        check_resumable(None, me, "ckpt", force=False)
    check_resumable(None, me, "ckpt", force=True)


def test_a_finished_run_is_not_reused_under_other_code_unless_forced(compose_cfg, tmp_path, fmnist_root,  # noqa: F811
                                                                       monkeypatch):
    overrides = [*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", "loss=stk", "result_file=null"]
    first = train(compose_cfg(*overrides), tmp_path / "first")
    assert [segment["from_step"] for segment in first["segments"]] == [0]
    again = train(compose_cfg(*overrides), tmp_path / "again")  # the finished checkpoint, same code: reused
    assert again["metrics"] == first["metrics"] and [s["from_step"] for s in again["segments"]] == [0, first["steps"]]

    identity = loop.segment_identity
    monkeypatch.setattr(loop, "segment_identity", lambda device: {**identity(device), "code": "0" * 16})
    with pytest.raises(TopklabError, match=f"code {first['segments'][0]['code']}, this run has 0{{16}}.*engine.resume=force"):
        train(compose_cfg(*overrides), tmp_path / "changed")
    forced = train(compose_cfg(*overrides, "engine.resume=force"), tmp_path / "forced")
    assert [segment["code"] for segment in forced["segments"]] == [first["segments"][0]["code"], "0" * 16]


def test_docstring_examples():
    import doctest

    import topklab.engine.run_identity

    result = doctest.testmod(topklab.engine.run_identity)
    assert result.attempted > 0 and result.failed == 0


def test_a_run_removes_the_temporaries_a_killed_write_left(compose_cfg, tmp_path, fmnist_root):  # noqa: F811
    from topklab.engine.checkpoint import run_key

    cfg = compose_cfg(*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", "loss=stk", "result_file=null")
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    workdir.mkdir(parents=True)
    stale = [workdir / ".last.pt.k2j4.tmp", workdir / ".run.json.x9.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    train(cfg, tmp_path / "run")
    assert not any(path.exists() for path in stale) and (workdir / "last.pt").is_file()


def test_an_unwritable_checkpoint_folder_stops_the_run_before_training(compose_cfg, tmp_path, fmnist_root):  # noqa: F811
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")  # a file where a folder must go: refused even to root, unlike chmod
    cfg = compose_cfg(*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", "result_file=null",
                      f"paths.checkpoint_dir={blocker}/checkpoints")
    with pytest.raises(TopklabError, match=f"cannot write to {blocker}/checkpoints .*another paths.checkpoint_dir"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_corrupt_run_record_in_the_checkpoint_folder_is_one_line(compose_cfg, tmp_path, fmnist_root):  # noqa: F811
    from topklab.engine.checkpoint import run_key

    cfg = compose_cfg(*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", "result_file=null",
                      "engine.resume=false")
    workdir = tmp_path / "checkpoints" / run_key(cfg)
    workdir.mkdir(parents=True)
    (workdir / "run.json").write_text('{"epoch": 3, "ste')
    with pytest.raises(TopklabError, match="run.json is corrupt .*delete .* to start this run afresh"):
        train(cfg, tmp_path / "run")


def test_an_unwritable_result_folder_stops_the_run_before_training(compose_cfg, tmp_path, fmnist_root):  # noqa: F811
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = compose_cfg(*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", f"result_file={blocker}/r/seed0.json")
    with pytest.raises(TopklabError, match="cannot write to .*another result_file"):
        train(cfg, tmp_path / "run")
    assert not list((tmp_path / "checkpoints").glob("*/last.pt"))


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0")])
def test_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path, failure):
    from topklab.utils.io import _atomic

    def write(handle):
        handle.write("part")
        raise failure

    with pytest.raises(TopklabError, match=r"no space left on the device of .* while writing last.pt; free some"):
        _atomic(tmp_path / "last.pt", write, "w")
    assert list(tmp_path.iterdir()) == []


def test_another_write_failure_keeps_its_own_error(tmp_path):
    from topklab.utils.io import _atomic

    def write(handle):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        _atomic(tmp_path / "last.pt", write, "w")
