"""Every docstring example under src/topklab/ runs as shown, one test per module (so a failure names
the module), with ELLIPSIS and NORMALIZE_WHITESPACE. Examples that cannot run here (they read
results/, a data or config tree, or write files) are marked ``# doctest: +SKIP`` where they stand;
a module whose import needs an optional package that is not installed is skipped with that package
named. This supersedes the per-module ``doctest.testmod`` tests the other files used to hold."""

import doctest
import importlib
import re

import pytest

from helpers import ROOT

SRC = ROOT / "src"
EXAMPLE = re.compile(r"^\s*>>> ", re.MULTILINE)
# A missing one of these is a broken install, never a reason to skip.
REQUIRED = {"topklab", "torch", "numpy", "hydra", "omegaconf"}
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_with_examples() -> list[str]:
    """Dotted names of the modules whose source holds a ``>>>`` line (read as text: nothing imported here)."""
    names = []
    for path in sorted((SRC / "topklab").rglob("*.py")):
        if EXAMPLE.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(SRC).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_the_examples_are_found():
    assert len(MODULES) > 80 and "topklab.data.translation.batching" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        if not package or package in REQUIRED:
            raise
        pytest.skip(f"{name} needs the optional package {package!r}, not installed")
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = []
    for test in finder.find(module, name):
        runner.run(test, out=report.append)
    if runner.tries == 0:
        pytest.skip(
            f"{name}: every example is marked +SKIP (they need results/, a data or config tree, or write files)"
        )
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples fail:\n" + "".join(report)
