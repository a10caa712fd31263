"""The tests mirror src/: every test module lies in ``tests/<folder>/test_*.py``, where
<folder> names a package or top-level module of ``src/topklab`` (``tests/config/`` holds config.py's and
cli.py's tests), or is ``integration`` (end to end across packages: train.py, sweeps, torchrun, faults, the
library wheel, experiment rows) or ``repo`` (repository-wide checks: lint, docs, imports, doctests, this
file); ``tests/bench/`` tests ``benchmarks/``, beside the package. ``tests/helpers/`` holds what
several folders share, ``tests/fixtures/`` recorded data; neither holds tests. `make test-unit` runs the
mirrored folders, so a folder that names no package would fall out of it."""

from helpers import ROOT

TESTS = ROOT / "tests"
CROSS_CUTTING = {"integration", "repo"}
BESIDE = {"bench"}  # the tests of benchmarks/, the package beside src/topklab
NOT_TESTS = {"helpers", "fixtures"}  # shared helper modules, recorded data


def src_names() -> set[str]:
    """``src/topklab``'s packages and top-level modules (``engine``, ``config``, ``smoothing``, ...)."""
    src = ROOT / "src" / "topklab"
    packages = {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in src.glob("*.py") if p.stem != "__init__"}
    return packages | modules


def folders() -> list:
    return sorted(
        p for p in TESTS.iterdir() if p.is_dir() and p.name not in NOT_TESTS and not p.name.startswith((".", "__"))
    )


def test_no_test_module_lies_directly_in_tests():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"move {loose} into tests/<package>/ (the src/topklab package it tests), integration/ or repo/"


def test_every_test_folder_mirrors_a_src_package_or_is_integration_or_repo():
    allowed = src_names() | CROSS_CUTTING | BESIDE
    stray = [p.name for p in folders() if p.name not in allowed]
    assert not stray, f"tests/{stray} name no package of src/topklab (nor integration/repo): rename or merge them"


def test_test_modules_lie_one_folder_deep_and_not_among_the_helpers():
    misplaced = sorted(
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.parent.parent != TESTS or p.parent.name in NOT_TESTS
    )
    assert not misplaced, f"test modules outside tests/<package>/: {misplaced}"


def test_test_module_names_are_unique():
    """pytest imports test modules by file name (rootdir mode, no __init__.py): two alike would clash."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_layout_is_what_the_checks_read():
    """Guard the guard: the checks above see the mirrored folders, and src names at least these."""
    assert {"engine", "losses", "operators", "config", "cli"} <= src_names()
    assert {"integration", "repo", "engine", "losses"} <= {p.name for p in folders()}
