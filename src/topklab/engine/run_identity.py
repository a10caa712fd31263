"""One identity for every stored number: a ``train.py`` result, a checkpoint resumed and a tabular cell
are reused (or resumed) only under an equal identity, and refused in one line naming what differs.

The identity (:func:`identity`) is, besides the config the caller compares itself:

- ``code``: :func:`code_version`, the training source. It hashes ``train.py``, ``setup.py`` (the native
  kernels' build flags) and every module of ``src/topklab`` that shapes training (all but ``report``,
  which renders stored results, ``loggers``, ``launch`` (sweeps) and ``cli``) and its C++
  kernels, over a normalised form: Python files by their syntax tree without docstrings, so comments,
  docstrings and reformatting do not count; C++ files by their non-blank lines stripped of surrounding
  space. Never the git commit: an edit to the README, a report or ``results/`` changes nothing.
- ``python``: Python's version (its syntax trees, so the code version, differ between versions);
- ``torch``: torch's version, and ``packages``: the versions of the other packages that compute
  (:data:`~topklab.utils.provenance.NUMERICS_PACKAGES`: numpy's generators split the data, timm and
  torchvision build models, difftopk and diffsort sort, sacrebleu scores, Triton compiles);
- ``native``: whether the C++ kernels are prebuilt (:func:`~topklab.utils.native.prebuilt_kernels`;
  where they are not and cannot be built, the losses fall back to other kernels);
- ``device``, and on CUDA ``gpu`` (the model) and ``cuda`` (the toolkit torch was built with);
- ``threads``, ``cpu_capability`` (torch's CPU kernels), ``cpu_isa`` (the CPU's widest vector set,
  by which MKL and oneDNN choose theirs) and ``environment``: the documented numerics variables set
  (:data:`~topklab.utils.provenance.NUMERICS_ENVIRONMENT`);
- ``world_size``: the processes of a ``torchrun`` launch (1 for one process);
- ``data``: the fingerprint of the files the run reads (:mod:`topklab.data.fingerprint`).

:data:`IDENTITY_FIELDS` lists them; every comparison (:func:`identity_differences`) goes over that list,
so a field added there is compared everywhere. A stored identity that predates a field compares under
:data:`PREDATING`; a field without an entry there is unrecorded and differs from any value.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import platform
from pathlib import Path

import torch

from topklab.utils.errors import TopklabError
from topklab.utils.native import prebuilt_kernels
from topklab.utils.provenance import NUMERICS_PACKAGES, cpu_isa, numerics_environment, package_versions

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPOSITORY_FILES = ("train.py", "setup.py")  # beside src/: the entry point and the native kernels' build flags
NOT_TRAINING_CODE = ("report", "loggers", "launch", "cli.py")  # parts of src/topklab that do not shape numbers

IDENTITY_FIELDS = (
    "code",
    "python",
    "torch",
    "packages",
    "native",
    "device",
    "gpu",
    "cuda",
    "threads",
    "cpu_capability",
    "cpu_isa",
    "environment",
    "world_size",
    "data",
)
PREDATING = {  # what a stored identity that lacks a field ran under
    "environment": {},  # recorded since the variables were; a number stored before ran under none of them
    "world_size": 1,  # every stored number before the field ran in one process
    "gpu": None,  # a CPU run records none
    "cuda": None,
    "native": "prebuilt",  # every stored number before the field was computed after `make setup`, which builds them
}
UNRECORDED = "unrecorded"


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
    """The part of a source file that can change what it computes (a Python file that does not parse:
    its text, as it stands)."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    if path.suffix == ".py":
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return text
        return ast.dump(_without_docstrings(tree), annotate_fields=False, include_attributes=False)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def training_files(root: str | Path = PACKAGE_ROOT) -> list[tuple[str, Path]]:
    """``(name, path)`` of every file in :func:`code_version`: the training modules under ``root`` (a
    package directory) and, where they exist, :data:`REPOSITORY_FILES` two levels above it."""
    base = Path(root).resolve()
    files = [
        (path.relative_to(base).as_posix(), path)
        for path in sorted(base.rglob("*"))
        if path.suffix in (".py", ".cpp")
        and path.is_file()
        and path.relative_to(base).parts[0] not in NOT_TRAINING_CODE
    ]
    repository = base.parents[1]
    return files + [(f"../../{name}", repository / name) for name in REPOSITORY_FILES if (repository / name).is_file()]


def code_version(root: str | Path = PACKAGE_ROOT) -> str:
    """16 hex digits over the normalised training source (:func:`training_files`).

    Examples
    --------
    >>> len(code_version()) == 16
    True
    """
    return _code_version(str(Path(root).resolve()))


@functools.cache
def _code_version(root: str) -> str:
    digest = hashlib.sha256()
    for name, path in training_files(root):
        digest.update(f"{name}\0{normalised_source(path)}\0".encode())
    return digest.hexdigest()[:16]


def torch_version() -> str:
    """torch's version, as this process imported it."""
    return torch.__version__


def world_size() -> int:
    """The processes of this launch: ``WORLD_SIZE`` as ``torchrun`` sets it, else 1."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise TopklabError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a whole number; unset it") from None


def identity(device: torch.device, data: str | None) -> dict:
    """This process's identity (the module docstring), for a run on ``device`` reading data of
    fingerprint ``data`` (None: data that names no files)."""
    cuda = device.type == "cuda"
    return {
        "code": code_version(),
        "python": platform.python_version(),
        "torch": torch_version(),
        "packages": package_versions(NUMERICS_PACKAGES),
        "native": prebuilt_kernels(),
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else None,
        "cpu_isa": cpu_isa(),
        "environment": numerics_environment(),
        "world_size": world_size(),
        "data": data,
    }


def _difference(field: str, theirs, mine) -> str:
    """``field theirs → mine``; of two mappings (packages, environment variables) only the entries that differ."""
    if isinstance(theirs, dict) and isinstance(mine, dict) and field == "packages":
        keys = sorted(k for k in set(theirs) | set(mine) if theirs.get(k, UNRECORDED) != mine.get(k, UNRECORDED))
        return "; ".join(f"{field} {k} {theirs.get(k, UNRECORDED)} → {mine.get(k, UNRECORDED)}" for k in keys)
    return f"{field} {theirs} → {mine}"


def identity_differences(stored: dict | None, current: dict) -> list[str]:
    """``field stored → current`` for each field of :data:`IDENTITY_FIELDS` where they differ, a field
    the stored identity lacks comparing under :data:`PREDATING` (else unrecorded); of ``packages`` each
    package that differs.

    Examples
    --------
    >>> me = {"code": "a", "threads": 1}
    >>> identity_differences({"code": "a"}, me)
    ['threads unrecorded → 1']
    >>> identity_differences({"code": "a", "threads": 2, "world_size": 1}, {**me, "world_size": 1})
    ['threads 2 → 1']
    >>> identity_differences({"packages": {"numpy": "1", "timm": "2"}}, {"packages": {"numpy": "1", "timm": "3"}})
    ['packages timm 2 → 3']
    """
    stored = stored or {}
    return [
        _difference(field, theirs, current[field])
        for field in IDENTITY_FIELDS
        if field in current and (theirs := stored.get(field, PREDATING.get(field, UNRECORDED))) != current[field]
    ]


def segment_identity(device: torch.device, data: str | None) -> dict:
    """A checkpoint segment's identity: :func:`identity`."""
    return identity(device, data)


def check_resumable(saved: dict | None, current: dict, where: str | Path, force: bool) -> None:
    """Refuse, in one line, to resume a checkpoint written under another identity (unless ``force``).

    Examples
    --------
    >>> me = {"code": "a", "device": "cpu", "threads": 1, "cpu_capability": "AVX2", "torch": "2.13.0"}
    >>> check_resumable(me, dict(me), "ckpt", force=False)
    >>> check_resumable(me, {**me, "threads": 2}, "ckpt", force=False)
    Traceback (most recent call last):
    ...
    topklab.utils.errors.TopklabError: the checkpoint in ckpt was written with threads 1 → 2; start afresh
    (engine.resume=false, or another paths.checkpoint_dir) or resume anyway with engine.resume=force
    """
    if force:
        return
    if saved is None:
        detail = "has no record of the code and machine that wrote it"
    else:
        differences = identity_differences(saved, current)
        if not differences:
            return
        detail = f"was written with {'; '.join(differences)}"
        if saved.get("data") != current.get("data"):
            detail += " (other data files: check paths.data_dir and dataset.root)"
    raise TopklabError(
        f"the checkpoint in {where} {detail}; start afresh (engine.resume=false, or another "
        "paths.checkpoint_dir) or resume anyway with engine.resume=force"
    )
