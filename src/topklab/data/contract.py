"""The Data contract (docs/contracts.md): what a dataset's ``splits()`` returns must carry, checked
when a run is built, so a missing field is one line naming it and the page, before any training."""

from __future__ import annotations

from topklab.utils.errors import TopklabError

PAGE = "docs/contracts.md"
DATA_FIELDS = {
    "name": "the dataset's name in the run record",
    "task": "what its targets are, e.g. binary or regression",
    "info": "a dict with split_seed, kept in the run record",
    "provides": "a method: () -> the constructor arguments it gives the model, losses and task",
    "targets": "a method: (split) -> that split's targets",
    "train_loader": "a method: (batch_size, drop_last, seed, device, channels_last) -> a loader",
    "eval_loader": "a method: (split, batch_size, device, channels_last) -> a loader",
}
METHODS = ("provides", "targets", "train_loader", "eval_loader")


def check_data(data, dataset: str) -> None:
    """A one-line :class:`TopklabError` for the first field of :data:`DATA_FIELDS` that ``data``
    (``splits()``'s return) lacks, or a non-callable method, or an ``info`` without ``split_seed``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> check_data(SimpleNamespace(name="toy", task="regression"), "toy.Toy")
    Traceback (most recent call last):
    ...
    topklab.utils.errors.TopklabError: dataset toy.Toy: its splits() has no `info` (a dict with split_seed, kept in the run record); see docs/contracts.md
    """
    for field, what in DATA_FIELDS.items():
        value = getattr(data, field, None)
        if value is None or (field in METHODS and not callable(value)):
            raise TopklabError(f"dataset {dataset}: its splits() has no `{field}` ({what}); see {PAGE}")
    if not isinstance(data.info, dict) or "split_seed" not in data.info:
        raise TopklabError(f"dataset {dataset}: its splits()' `info` has no `split_seed` (an int); see {PAGE}")
