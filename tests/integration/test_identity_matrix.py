"""The perturbation matrix of a stored number's identity: for every input the identity lists
(:data:`~topklab.engine.run_identity.IDENTITY_FIELDS`, each documented numerics variable, each config
class, one byte of the data, one line of a training file) and every stored kind (a ``train.py``
result, a resume, a tabular cell), the guard's own entry point (the result plan, the resume check, the
cell plan) refuses the stored number in one line naming the input; changes that cannot alter a number
(a comment or docstring in a training file, a file outside the training path, the README, another
row's result, the engine's resume and progress fields) are reused. The matrix is generated from the
identity's own list, so a field added to it without a perturbation here fails the first test."""

import copy
import gzip
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import topklab.engine.run as run_module
import topklab.engine.run_identity as run_identity
import topklab.protocol.reproduce as reproduce_module
from helpers import CONFIG_DIR, ROOT
from helpers.vision_files import write_fashion_mnist
from helpers.vision_runs import TINY_FMNIST
from topklab.config import compose_run
from topklab.engine.checkpoint import CheckpointStore, run_key
from topklab.engine.loop import SEGMENT_PLACE
from topklab.engine.run import plan_result, train
from topklab.utils.errors import TopklabError
from topklab.utils.provenance import NUMERICS_ENVIRONMENT, package_versions

KINDS = ("result", "resume", "cell")


@pytest.fixture(scope="module", autouse=True)
def hydra_once():
    """Hydra initialised once for the module, every entry point composing under it; the numerics variables
    and the world size unset for the whole module (the suite may run under some), the stored cases included."""
    with pytest.MonkeyPatch.context() as patch, initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in (*NUMERICS_ENVIRONMENT, "WORLD_SIZE"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def stored(tmp_path_factory, hydra_once):
    """One trained case per stored kind: a ``train.py`` result and its checkpoint (tiny Fashion-MNIST-LT
    written here, so its bytes can change), and a tabular cell (wisconsin, Average, two splits)."""
    root = tmp_path_factory.mktemp("matrix")
    data = write_fashion_mnist(root / "fmnist", per_class_train=50, per_class_test=6)
    overrides = [
        *TINY_FMNIST,
        f"dataset.root={data}",
        "engine.epochs=1",
        f"paths.root_dir={root}",
        f"paths.log_dir={root}/logs",
        f"result_file={root}/results/vision/t/r/seed0.json",
    ]
    cfg = compose_run(overrides)
    train(cfg, root / "run", overrides=[])
    cells = cell_setup(root)
    reproduce_module.reproduce(cells)
    return {"root": root, "data": data, "overrides": overrides, "cfg": cfg, "cells": cells}


def cell_setup(root: Path):
    preset = OmegaConf.to_container(compose_run(["experiment=stk/table3/wisconsin", "preset=quick"]).preset)
    preset.update(name="tiny", n_splits=2, max_epochs=1, grid={"k": [1], "C": [10.0], "lr": [0.1], "delta": [0.1]})
    return OmegaConf.create(
        {
            "row": "stk/table3/wisconsin", "preset": preset, "results_dir": str(root / "cells"),
            "aggregates": "average", "threads": 0, "progress": False, "config_dir": str(CONFIG_DIR),
            "paths": {"root_dir": str(ROOT), "data_dir": str(ROOT / ".data")},
        }
    )  # fmt: skip


def guard(kind: str, stored: dict, overrides: list[str] = (), edit=None) -> str | None:
    """The entry point of ``kind`` on the stored case: None where the stored number is reused (or resumed),
    the refusal's one line where it is refused. ``edit`` changes the composed config (the run's; a cell's
    setup and each cell's composed config) in place."""
    try:
        if kind == "result":
            cfg = composed_once([*stored["overrides"], *overrides])
            if edit:
                edit(cfg)
            planned = plan_result(cfg, [], stored["root"] / "planned", run_module.data_fingerprint(cfg))
            assert planned[0] == Path(cfg.result_file) and set(planned[2]) == {"compare", "stored"}
        elif kind == "resume":
            cfg = composed_once([*stored["overrides"], *overrides])
            store = CheckpointStore(Path(cfg.paths.checkpoint_dir) / run_key(cfg))
            saved = store.load()["progress"]["segments"][-1]
            current = run_identity.identity(torch.device("cpu"), run_module.data_fingerprint(cfg))
            saved = {k: v for k, v in saved.items() if k not in SEGMENT_PLACE}
            run_identity.check_resumable(saved, current, store.directory, force=False)
        else:
            setup = stored["cells"].copy()
            real = reproduce_module.compose_run
            if edit:
                edit(setup)

                def composed(arguments):
                    cfg = real(arguments)
                    edit(cfg)
                    return cfg

                reproduce_module.compose_run = composed
            try:
                reproduce_module.reproduce(setup)
            finally:
                reproduce_module.compose_run = real
    except TopklabError as error:
        message = str(error)
        assert "\n" not in message
        return message
    return None


COMPOSED = {}
EDITED = []  # a test that edits the source read by the code version: its cache is cleared after it


def composed_once(arguments: list[str]):
    """``compose_run(arguments)``, composed once per module (Hydra must be initialised), a fresh copy each call."""
    key = tuple(arguments)
    if key not in COMPOSED:
        COMPOSED[key] = compose_run(list(arguments))
    return copy.deepcopy(COMPOSED[key])


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(reproduce_module, "compose_run", composed_once)
    monkeypatch.setattr(reproduce_module, "run_cell", lambda *a, **k: pytest.fail("a stored cell was retrained"))
    monkeypatch.setattr(run_module, "build_run", lambda cfg: pytest.fail("a run trained"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    if EDITED:
        EDITED.clear()
        run_identity._code_version.cache_clear()


def with_identity(monkeypatch, **fields):
    """Fields the CPU cannot change here (a GPU's device, model and CUDA), as the identity reads them."""
    real = run_identity.identity

    def changed(device, data):
        return {**real(device, data), **fields}

    for module in (run_identity, run_module, reproduce_module):
        monkeypatch.setattr(module, "identity", changed)


def edited_source(monkeypatch, name: str, edit) -> None:
    """The training file ``name`` (as :func:`~topklab.engine.run_identity.training_files` names it)
    with ``edit`` applied to its text, as the code version reads it."""
    import tempfile

    real = run_identity.normalised_source
    target = dict(run_identity.training_files())[name]
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / target.name
        copy.write_text(edit(target.read_text()))
        edited = real(copy)
    monkeypatch.setattr(run_identity, "normalised_source", lambda path: edited if path == target else real(path))
    run_identity._code_version.cache_clear()
    EDITED.append(name)


def flip_a_byte(monkeypatch, stored: dict, kind: str):
    """One byte of the data the stored case read, changed (the training labels for the result and the
    resume; the package's data file for the cell, read from a changed copy); returns the undo."""
    if kind == "cell":
        from topklab.data.tabular import sources

        real = sources.package_file
        copy = stored["root"] / "wisconsin.dat"

        def package_file(package, relative):
            path = real(package, relative)
            if path.name != "wisconsin.dat":
                return path
            raw = bytearray(path.read_bytes())
            raw[-3] = ord("2") if raw[-3] != ord("2") else ord("4")
            copy.write_bytes(bytes(raw))
            return copy

        monkeypatch.setattr(sources, "package_file", package_file)
        return None
    labels = stored["data"] / "train-labels-idx1-ubyte.gz"
    original = labels.read_bytes()
    raw = bytearray(gzip.decompress(original))
    raw[-1] = (raw[-1] + 1) % 10
    labels.write_bytes(gzip.compress(bytes(raw)))
    return lambda: labels.write_bytes(original)


def perturbations() -> dict[str, list]:
    """``field → [(case id, apply(monkeypatch, stored, kind))]`` for every identity field."""

    def env(name):
        return lambda mp, stored, kind: mp.setenv(name, "AVX2")

    return {
        "code": [("engine/stopping.py: one line", lambda mp, s, k: edited_source(
            mp, "engine/stopping.py", lambda text: text.replace(">= self.patience", "> self.patience")))],
        "torch": [("another torch", lambda mp, s, k: mp.setattr(run_identity, "torch_version", lambda: "2.0.0+other"))],
        "python": [("another Python", lambda mp, s, k: mp.setattr(run_identity.platform, "python_version", lambda: "3.12.1"))],
        "device": [("another device", lambda mp, s, k: with_identity(mp, device="mps"))],
        "gpu": [("another GPU model", lambda mp, s, k: with_identity(mp, gpu="NVIDIA H200"))],
        "cuda": [("another CUDA", lambda mp, s, k: with_identity(mp, cuda="13.0"))],
        "threads": [("another thread count", lambda mp, s, k: torch.set_num_threads(torch.get_num_threads() + 1))],
        "cpu_capability": [("other CPU kernels", lambda mp, s, k: mp.setattr(
            torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT"))],
        "environment": [(f"{name} set", env(name)) for name in sorted(NUMERICS_ENVIRONMENT)],
        "world_size": [("WORLD_SIZE=2", lambda mp, s, k: mp.setenv("WORLD_SIZE", "2"))],
        "packages": [("another numpy", lambda mp, s, k: mp.setattr(
            run_identity, "package_versions", lambda names: {**package_versions(names), "numpy": "0.0.1"}))],
        "native": [("the C++ kernels not built", lambda mp, s, k: mp.setattr(
            run_identity, "prebuilt_kernels", lambda: "_thresholded_cpu unavailable"))],
        "cpu_isa": [("a CPU of another vector set", lambda mp, s, k: mp.setattr(run_identity, "cpu_isa", lambda: "avx"))],
        "data": [("one byte of the data", flip_a_byte)],
    }  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_each_stored_case_is_reused_as_it_is(kind, stored, no_training):
    assert guard(kind, stored) is None


def test_every_identity_field_has_a_perturbation():
    assert set(perturbations()) == set(run_identity.IDENTITY_FIELDS)


MATRIX = [(field, case, apply) for field, cases in perturbations().items() for case, apply in cases]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field, case, apply", MATRIX, ids=[f"{f}: {c}" for f, c, _ in MATRIX])
def test_a_changed_identity_input_is_refused_in_one_line(kind, field, case, apply, stored, monkeypatch, no_training):
    undo = apply(monkeypatch, stored, kind)
    try:
        refusal = guard(kind, stored)
    finally:
        if callable(undo):
            undo()
    if (kind, field) == ("cell", "world_size"):  # a cell trains in one process, whatever launched it
        assert refusal is None
        return
    assert refusal is not None and f"{field} " in refusal, refusal


def first_number(node, prefix: str) -> str | None:
    """The dotted key of the first number in a config node (depth first), None if it holds none."""
    if isinstance(node, dict):
        for key, value in node.items():
            found = first_number(value, f"{prefix}.{key}")
            if found:
                return found
        return None
    return prefix if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def config_classes(config: dict, skip=()) -> dict[str, str]:
    """``class → dotted key``: one number of each top-level class of ``config`` (a portable config or
    a preset), or its ``_target_`` where it holds no number."""
    keys = {}
    for name, node in config.items():
        if name in skip:
            continue
        key = first_number(node, name)
        if key is None and isinstance(node, dict) and "_target_" in node:
            key = f"{name}._target_"
        if key is not None:
            keys[name] = key
    return keys


def changed(value):
    return "topklab.Other" if isinstance(value, str) else value + 1


def class_cases() -> list[tuple[str, str]]:
    from topklab.engine.result_guard import IGNORED_CONFIG_KEYS
    from topklab.utils.provenance import portable_config

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        result = portable_config(compose_run([*TINY_FMNIST, "engine.epochs=1"]))
        cell = compose_run(["experiment=stk/table3/wisconsin", "individual=logistic", "loss=average"])
        preset = OmegaConf.to_container(cell.preset)
        cell_classes = [
            f"preset.{key}" for key in config_classes(preset, ("name", "max_members", "check_stored")).values()
        ]
        cell_classes += config_classes({k: OmegaConf.to_container(cell[k]) for k in ("dataset", "individual")}).values()
    return [("result", key) for key in config_classes(result, IGNORED_CONFIG_KEYS).values()] + [
        ("cell", key) for key in cell_classes
    ]


@pytest.mark.parametrize("kind, key", class_cases(), ids=[f"{k}: {key}" for k, key in class_cases()])
def test_a_changed_config_class_is_refused_in_one_line(kind, key, stored, no_training):
    def edit(cfg):
        node = cfg
        parts = key.split(".")
        setup = "results_dir" in cfg  # a cell's setup (its preset), else a composed cell config
        if kind == "cell" and (parts[0] == "preset") != setup:
            return
        for part in parts[:-1]:
            node = node[part]
        value = node[parts[-1]]
        node[parts[-1]] = changed(value[0] if isinstance(value, list) else value)

    refusal = guard(kind, stored, edit=edit)
    assert refusal is not None and "other settings" in refusal, refusal


UNCHANGING = {
    "a comment in a training file": lambda mp: edited_source(
        mp, "engine/stopping.py", lambda text: text + "\n# a comment\n"
    ),
    "a docstring in a training file": lambda mp: edited_source(
        mp, "engine/stopping.py", lambda text: text.replace('"""', '"""Reworded. ', 1)
    ),
    "a file outside the training path": lambda mp: _edited_report(mp),
}


def _edited_report(monkeypatch):
    real = run_identity.normalised_source
    monkeypatch.setattr(
        run_identity, "normalised_source", lambda path: real(path) + ("x = 1" if "report" in path.parts else "")
    )
    run_identity._code_version.cache_clear()
    EDITED.append("report")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", sorted(UNCHANGING))
def test_a_change_that_cannot_alter_a_number_is_reused(kind, change, stored, monkeypatch, no_training):
    UNCHANGING[change](monkeypatch)
    assert guard(kind, stored) is None


def test_the_readme_another_rows_result_and_the_engine_s_resume_fields_are_reused(
    stored, monkeypatch, no_training, tmp_path
):
    readme = ROOT / "README.md"
    assert "README.md" not in {name for name, _ in run_identity.training_files()}
    other = stored["root"] / "results" / "vision" / "t" / "other" / "seed0.json"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text("{}")
    for kind in ("result", "resume"):
        assert guard(kind, stored, ["engine.resume=false", "engine.progress=true"]) is None
    assert guard("cell", stored) is None and readme.is_file()


def test_every_training_file_is_in_the_code_version(monkeypatch):
    """A line of any training file changes the code version; a comment in none does. And every module
    of the package that a run imports is one of them."""
    files = run_identity.training_files()
    sources = {path: run_identity.normalised_source(path) for _, path in files}
    monkeypatch.setattr(run_identity, "normalised_source", lambda path: sources[path])
    run_identity._code_version.cache_clear()
    base = run_identity.code_version()
    versions = set()
    for _, path in files:
        monkeypatch.setitem(sources, path, sources[path] + "\0edited")
        run_identity._code_version.cache_clear()
        versions.add(run_identity.code_version())
        monkeypatch.setitem(sources, path, sources[path][: -len("\0edited")])
    run_identity._code_version.cache_clear()
    assert len(versions) == len(files) and base not in versions and run_identity.code_version() == base
    assert {"../../train.py", "../../setup.py"} <= {name for name, _ in files}


def test_every_package_module_a_run_imports_is_training_code_or_named_outside_it(stored):
    import sys

    package = run_identity.PACKAGE_ROOT
    hashed = {path for _, path in run_identity.training_files()}
    imported = {
        Path(module.__file__).resolve()
        for module in list(sys.modules.values())
        if getattr(module, "__file__", None)
        and Path(module.__file__).resolve().is_relative_to(package)
        and Path(module.__file__).suffix == ".py"
    }
    outside = {
        path for path in imported - hashed if path.relative_to(package).parts[0] not in run_identity.NOT_TRAINING_CODE
    }
    assert imported and not outside, sorted(map(str, outside))
