from __future__ import annotations


class NullLogger:
    """Logs nothing beyond the run record every run writes."""

    id: str | None = None

    def start(self, run_dir, config: dict, resume_id: str | None = None) -> None:
        pass

    def log(self, row: dict) -> None:
        pass

    def replay(self, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass
