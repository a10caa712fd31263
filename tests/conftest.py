import atexit
import importlib.util
import logging
import os
import shutil
import sys
import tempfile

from helpers import CONFIG_DIR, ROOT, TABULAR_DATASETS  # noqa: F401  (tests/ is on sys.path: pyproject's pythonpath)

os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
if "TOPKLAB_CACHE_DIR" not in os.environ:  # file digests go to a folder of this test process, not ~/.cache/topklab
    os.environ["TOPKLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="topklab-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TOPKLAB_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():  # Triton kernels run in its interpreter on CPU tensors; read at triton's import
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hydra import initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

import topklab  # noqa: E402,F401  (torchvision shim before anything imports torchvision)
from topklab.config import compose_run  # noqa: E402

if "PYTEST_XDIST_WORKER" in os.environ:  # make test's processes share the cores rather than each taking all of them
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def _parse_each_config_file_once() -> None:
    """Hydra parses every YAML file of a composition afresh on every composition (about a quarter of
    its time), and the tests compose thousands of times: here each file is parsed once per path,
    modification time and size, and every load gets a deep copy of it, what a fresh parse gives.
    Installed after Hydra's plugin scan, which executes its core plugin modules anew."""
    import copy

    from hydra.core.plugins import Plugins

    Plugins.instance()
    from hydra._internal.core_plugins.file_config_source import FileConfigSource

    parse, parsed = FileConfigSource.load_config, {}

    def load_config(source, config_path: str):
        path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
        try:
            stat = os.stat(path)
        except OSError:
            return parse(source, config_path)  # Hydra's own "Config not found" error
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in parsed:
            parsed[key] = parse(source, config_path)
        return copy.deepcopy(parsed[key])

    FileConfigSource.load_config = load_config


_parse_each_config_file_once()


# module-scoped fixtures of tiny vision data (fmnist_root, cifar_root, listed_tree) for every folder
pytest_plugins = ["helpers.vision_runs"]


def _result_files() -> dict:
    return {p: p.stat().st_mtime_ns for p in (ROOT / "results").rglob("*") if p.is_file()}


@pytest.fixture(scope="session", autouse=True)
def results_tree_untouched():
    """No test may write into the repository's results/ (experiment rows default to it)."""
    before = _result_files()
    yield
    changed = sorted(str(p.relative_to(ROOT)) for p, mtime in _result_files().items() if before.get(p) != mtime)
    assert not changed, f"tests wrote into results/: {changed}; pass result_file=null or a tmp path"


def _torch_global_state() -> dict:
    return {
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
    }


@pytest.fixture(autouse=True)
def torch_global_state_restored():
    """A test leaves torch's process-wide settings as it found them: a default dtype left at half
    precision (say) would change the numbers of whatever test the same worker runs next."""
    before = _torch_global_state()
    yield
    after = _torch_global_state()
    torch.set_default_dtype(before["default dtype"])
    torch.set_grad_enabled(before["grad mode"])
    torch.use_deterministic_algorithms(before["deterministic algorithms"])
    changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
    assert not changed, f"this test left torch's global state changed (before, after): {changed}"


@pytest.fixture(scope="session")
def composed_rows(tmp_path_factory) -> dict:
    """``{row: config}`` of every row of configs/experiment/, composed once per run as train.py
    composes it (seed 0, logs under one folder for the test run), read-only: tests share them. Under
    ``make test``'s workers the first to need them composes them (≈ 60 s here) and pickles them into
    a file for the others, which load them (a fraction of a second; as YAML it took ≈ 5 s): the same containers, struct as
    composed."""
    import pickle

    from filelock import FileLock
    from omegaconf import OmegaConf

    from topklab.config import config_groups

    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # this run's folder, which every worker's folder is in
    cache, log_dir = shared / "composed_rows.pickle", shared / "rows"
    with FileLock(f"{cache}.lock"):
        if cache.exists():
            rows = pickle.loads(cache.read_bytes())
        else:
            log_dir.mkdir()
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                rows = {
                    row: compose_run([f"paths.log_dir={log_dir}", f"experiment={row}"])
                    for row in config_groups(CONFIG_DIR)["experiment"]
                }
            part = cache.with_suffix(".part")
            part.write_bytes(pickle.dumps(rows))
            part.replace(cache)
    for cfg in rows.values():
        OmegaConf.set_readonly(cfg, True)
    return rows


@pytest.fixture
def compose_cfg(tmp_path):
    """Compose configs/train.yaml with overrides once, as train.py does (the dataset chooses its recipe), logging under tmp_path."""

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose_run([f"paths.log_dir={tmp_path}", *overrides])

    return _compose


@pytest.fixture(scope="session")
def train_py():
    """train.py as a module: ``cli()`` with ``sys.argv = [train.py, *ARGV]`` is ``python train.py ARGV``
    in this process."""
    spec = importlib.util.spec_from_file_location("topklab_train_py", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_cli(train_py, monkeypatch, capsys):
    """``run_cli(*argv)`` -> (exit code, stdout, stderr) of train.py's command line, run in this process."""

    def run(*argv):
        monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py"), *argv])
        monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")  # Hydra then finds configs/ beside train.py, as when run
        handlers, level = logging.root.handlers[:], logging.root.level
        capsys.readouterr()
        try:
            train_py.cli()
            code = 0
        except SystemExit as stop:
            code = stop.code
        finally:  # Hydra's global state and its logging set-up stay with this call
            GlobalHydra.instance().clear()
            for handler in logging.root.handlers:
                if handler not in handlers:
                    handler.close()
            logging.root.handlers[:], logging.root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    return run


INTEGRATION = ROOT / "tests" / "integration"


def pytest_collection_modifyitems(config, items):
    """Tests under ``tests/integration/`` are marked ``integration``. ``gpu``-marked tests run where CUDA is
    visible (``make setup DEVICE=cuda``) and skip elsewhere."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (make setup DEVICE=cuda on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
