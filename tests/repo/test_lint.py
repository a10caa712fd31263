"""ruff's lint and format checks (pyproject.toml [tool.ruff]) on the whole repository, so that CI, which
runs `make test`, fails on a finding as the pre-commit hook would."""

import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("ruff", reason="ruff is not installed (make setup installs requirements-cpu.txt)")


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
