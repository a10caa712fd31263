"""What produced a checkpoint: the code that shapes training, the machine settings that change its
numbers and the data it reads, kept per segment of a run so that a resume under other ones is refused instead of silent.

The code version hashes the source of ``src/topklab`` that shapes training (every module but
``report`` (renders stored results), ``bench``, ``loggers``, ``launch`` (sweeps) and ``cli``) and the C++ kernels, over a normalised form:
Python files by their syntax tree without docstrings, so comments, docstrings and reformatting do not
count; C++ files by their non-blank lines stripped of surrounding space. The configs a run composes
are in the run key already. Never the git commit: an edit to the README, a report or ``results/``
leaves a run that has trained for hours resumable.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import torch

from topklab.engine.result_guard import identity
from topklab.utils.errors import TopklabError

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NOT_TRAINING_CODE = ("report", "bench", "loggers", "launch", "cli.py")  # parts of src/topklab that do not shape numbers


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def normalised_source(path: Path) -> str:
    """The part of a source file that can change what it computes."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.dump(_without_docstrings(ast.parse(text)), annotate_fields=False, include_attributes=False)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def code_version(root: str | Path = PACKAGE_ROOT) -> str:
    """16 hex digits over the normalised training source under ``root`` (a package directory).

    Examples
    --------
    >>> len(code_version()) == 16
    True
    """
    return _code_version(str(Path(root).resolve()))


@functools.cache
def _code_version(root: str) -> str:
    base = Path(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in base.rglob("*") if p.suffix in (".py", ".cpp") and p.is_file()):
        relative = path.relative_to(base)
        if relative.parts[0] in NOT_TRAINING_CODE:
            continue
        digest.update(f"{relative.as_posix()}\0{normalised_source(path)}\0".encode())
    return digest.hexdigest()[:16]


UNRECORDED = {"environment": {}}  # what a checkpoint from before a field was recorded ran under


def segment_identity(device: torch.device, data: str | None) -> dict:
    """The code version, the settings of this process that change a run's numbers, and the
    fingerprint of the data files the run reads (:mod:`topklab.data.fingerprint`)."""
    return {"code": code_version(), **identity(device, data), "torch": torch.__version__}


def check_resumable(saved: dict | None, current: dict, where: str | Path, force: bool) -> None:
    """Refuse, in one line, to resume a checkpoint written under another identity (unless ``force``).

    Examples
    --------
    >>> me = {"code": "a", "device": "cpu", "threads": 1, "cpu_capability": "AVX2", "torch": "2.13.0"}
    >>> check_resumable(me, dict(me), "ckpt", force=False)
    >>> check_resumable(me, {**me, "threads": 2}, "ckpt", force=False)
    Traceback (most recent call last):
    ...
    topklab.utils.errors.TopklabError: the checkpoint in ckpt was written with threads 1, this run has 2;
    start afresh (engine.resume=false, or another paths.checkpoint_dir) or resume anyway with engine.resume=force
    """
    if force:
        return
    if saved is None:
        detail = "has no record of the code and machine that wrote it"
    else:
        differences = [
            f"{key} {saved.get(key, UNRECORDED.get(key))}, this run has {value}"
            for key, value in current.items()
            if saved.get(key, UNRECORDED.get(key)) != value
        ]
        if not differences:
            return
        detail = f"was written with {'; '.join(differences)}"
        if saved.get("cpu_capability") != current.get("cpu_capability"):
            detail += " (pin the CPU kernels with cpu_capability=avx2 on every command line of a campaign)"
        if saved.get("data") != current.get("data"):
            detail += " (other data files: check paths.data_dir and dataset.root)"
    raise TopklabError(
        f"the checkpoint in {where} {detail}; start afresh (engine.resume=false, or another "
        "paths.checkpoint_dir) or resume anyway with engine.resume=force"
    )
