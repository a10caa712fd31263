"""Mini-batches of small in-memory tensors (the tabular sets), in the order a single seeded
generator gives: epoch e is the (e+1)-th ``randperm`` of ``Generator().manual_seed(seed)``."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from topklab.utils.batching import batches_per_epoch


class TensorLoader:
    """Batches of rows of ``x`` and ``y``.

    Parameters
    ----------
    x, y : tensors with the same first dimension
    batch_size : int >= 1, or None for one batch holding the whole set (evaluation)
    shuffle : bool, a new random order every epoch (False: the stored order)
    drop_last : bool, drop an incomplete last batch (never the only one)
    seed : int, seed of the generator whose successive permutations order the epochs
    device : where batches are returned

    Any epoch can be asked for in any order (a resumed run starts mid-way); the generator is
    replayed from the seed when an earlier epoch is requested.

    Examples
    --------
    >>> loader = TensorLoader(torch.arange(5.0)[:, None], torch.arange(5.0), batch_size=2, shuffle=False)
    >>> [y.tolist() for _, y in loader.batches()]
    [[0.0, 1.0], [2.0, 3.0], [4.0]]
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int | None,
        shuffle: bool,
        drop_last: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.x, self.y = x.to(device), y.to(device)
        self.batch_size = batch_size or len(y)
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self._generator, self._next_epoch = None, 0

    def __len__(self) -> int:
        return batches_per_epoch(len(self.y), self.batch_size, self.drop_last)

    def _order(self, epoch: int) -> torch.Tensor:
        if self._generator is None or epoch < self._next_epoch:
            self._generator, self._next_epoch = torch.Generator().manual_seed(self.seed), 0
        while True:
            order = torch.randperm(len(self.y), generator=self._generator)
            self._next_epoch += 1
            if self._next_epoch > epoch:
                return order

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.shuffle and len(self) == 1:
            yield self.x, self.y
            return
        order = (
            self._order(epoch).to(self.x.device) if self.shuffle else torch.arange(len(self.y), device=self.x.device)
        )
        for b in range(start, len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.x[idx], self.y[idx]
