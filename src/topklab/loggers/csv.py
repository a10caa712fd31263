from __future__ import annotations

import csv
from pathlib import Path


class CSVLogger:
    """Writes every logged row (one per evaluation) to ``<run_dir>/<filename>``, begun afresh by each
    process; a resumed run first replays the rows its checkpoint kept, so the file equals an
    uninterrupted run's.

    Columns are fixed by the first row; later keys not in it are an error, missing ones blank.
    """

    def __init__(self, filename: str = "log.csv"):
        self.filename = filename
        self.id: str | None = None
        self._handle = None
        self._writer = None

    def start(self, run_dir, config: dict, resume_id: str | None = None) -> None:
        self.path = Path(run_dir) / self.filename
        self.id = str(self.path)
        self._handle = open(self.path, "w", newline="")

    def log(self, row: dict) -> None:
        if self._writer is None:
            self._writer = csv.DictWriter(self._handle, fieldnames=list(row))
            if self._handle.tell() == 0:
                self._writer.writeheader()
        self._writer.writerow(row)
        self._handle.flush()

    def replay(self, rows: list[dict]) -> None:
        for row in rows:
            self.log(row)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
