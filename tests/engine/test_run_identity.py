"""A checkpoint knows the code and machine settings that wrote it: a finished or killed run is not
resumed under other ones without ``engine.resume=force``, and every segment of a run is recorded.
Faults around a run's folders (unwritable, corrupt record, stale temporaries, a full disk) and a resume
under another thread count are in test_faults.py."""

import pytest

import topklab.engine.loop as loop
from helpers.vision_files import write_fashion_mnist
from helpers.vision_runs import TINY_FMNIST
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
        "return 2 * x", "# doubled\n    return (2 *\n            x)"
    )
    assert (
        write_package(
            tmp_path / "b",
            loss=reformatted,
            report="def render():\n    return 'another table'\n",
            kernel="\n  int f() { return 1; }  \n\n",
        )
        == original
    )
    assert write_package(tmp_path / "c", loss=LOSS.replace("2 * x", "3 * x")) != original
    assert write_package(tmp_path / "d", kernel="int f() { return 2; }\n") != original


def test_the_installed_code_version_is_stable_within_a_process():
    assert code_version() == code_version() and len(code_version()) == 16


def test_a_checkpoint_without_a_record_is_not_resumed_silently():
    me = {"code": "a", "device": "cpu", "threads": 1, "cpu_capability": "AVX2", "torch": "2.13.0"}
    with pytest.raises(TopklabError, match="no record of the code and machine .* engine.resume=force"):
        check_resumable(None, me, "ckpt", force=False)
    check_resumable(None, me, "ckpt", force=True)


def test_a_finished_run_is_not_reused_under_other_code_unless_forced(
    compose_cfg,
    tmp_path,
    fmnist_root,
    monkeypatch,
):
    overrides = [*TINY_FMNIST, f"dataset.root={fmnist_root}", "engine.epochs=1", "loss=stk", "result_file=null"]
    first = train(compose_cfg(*overrides), tmp_path / "first")
    assert [segment["from_step"] for segment in first["segments"]] == [0]
    again = train(compose_cfg(*overrides), tmp_path / "again")  # the finished checkpoint, same code: reused
    assert again["metrics"] == first["metrics"] and [s["from_step"] for s in again["segments"]] == [0, first["steps"]]

    identity = loop.segment_identity
    monkeypatch.setattr(loop, "segment_identity", lambda device, data: {**identity(device, data), "code": "0" * 16})
    with pytest.raises(TopklabError, match=f"code {first['segments'][0]['code']} → 0{{16}}.*engine.resume=force"):
        train(compose_cfg(*overrides), tmp_path / "changed")
    forced = train(compose_cfg(*overrides, "engine.resume=force"), tmp_path / "forced")
    assert [segment["code"] for segment in forced["segments"]] == [first["segments"][0]["code"], "0" * 16]


def test_a_run_is_not_resumed_on_other_data_and_a_forced_resume_lists_its_segments(compose_cfg, tmp_path, monkeypatch):
    """Another ``dataset.root`` is the same run key; a checkpoint of it on other files (the training labels
    permuted) is refused in one line, and a forced resume records both segments with their step ranges."""
    monkeypatch.setenv("TOPKLAB_CACHE_DIR", str(tmp_path / "cache"))
    real = write_fashion_mnist(tmp_path / "real", per_class_train=50, per_class_test=6)
    shuffled = write_fashion_mnist(tmp_path / "shuffled", per_class_train=50, per_class_test=6, seed=1)
    overrides = [*TINY_FMNIST, "engine.epochs=1", "loss=stk", "result_file=null"]
    first = train(compose_cfg(*overrides, f"dataset.root={real}"), tmp_path / "first")
    with pytest.raises(TopklabError, match=rf"data {first['data_fingerprint']} → \w{{16}} \(other data") as error:
        train(compose_cfg(*overrides, f"dataset.root={shuffled}"), tmp_path / "other")
    assert "\n" not in str(error.value) and not (tmp_path / "other").exists()
    forced = train(compose_cfg(*overrides, f"dataset.root={shuffled}", "engine.resume=force"), tmp_path / "forced")
    steps = first["steps"]
    assert [(s["data"], s["from_step"], s["to_step"], s.get("forced")) for s in forced["segments"]] == [
        (first["data_fingerprint"], 0, steps, None),
        (forced["data_fingerprint"], steps, steps, True),
    ]


def test_a_source_file_that_does_not_parse_is_hashed_as_text(tmp_path):
    from topklab.engine.run_identity import normalised_source

    broken = tmp_path / "stray.py"
    broken.write_text("def f(:\n", encoding="utf-8")
    assert normalised_source(broken) == "def f(:\n"
    accented = tmp_path / "accented.py"
    accented.write_text('"""Doc."""\nname = "λ"\n', encoding="utf-8")  # read as UTF-8 whatever the locale
    assert "λ" in normalised_source(accented) and "Doc." not in normalised_source(accented)


def test_the_native_field_says_which_kernels_run(monkeypatch):
    """Prebuilt, built here on first use, or not buildable (the losses then fall back to other kernels)."""
    from topklab.utils import native

    assert native.prebuilt_kernels() == "prebuilt"  # make setup builds them
    builds = native._builds.__wrapped__  # uncached
    monkeypatch.setattr(native, "find_prebuilt", lambda name, source: (None, "TOPKLAB_PREBUILT=0"))
    monkeypatch.setattr(native, "_builds", lambda name, source: "built here")
    assert native.prebuilt_kernels() == "_thresholded_cpu built here; _pav_cpu built here"

    def fails(*args):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(native, "_builds", builds)
    monkeypatch.setattr(native, "load_native", fails)
    assert native.prebuilt_kernels() == "_thresholded_cpu unavailable; _pav_cpu unavailable"
