"""Small files in the real on-disk layouts of the ImageNet path: an image tree (<split>/<class>/<image>)
and extracted embeddings (topklab.data.embeddings.store)."""

from pathlib import Path

import numpy as np


def write_image_tree(root: Path, classes: int = 6, per_class: dict | None = None, seed: int = 0) -> Path:
    """JPEG files root/<split>/<wnid>/<wnid>_<i>.JPEG of random sizes; the val split may lack classes."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    per_class = per_class or {"train": 3, "val": 1}
    for split, count in per_class.items():
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                size = (int(rng.randint(20, 48)), int(rng.randint(20, 48)), 3)
                Image.fromarray(rng.randint(0, 255, size, dtype=np.uint8)).save(folder / f"n{c:08d}_{i}.JPEG")
    return root


def write_embeddings(
    root: Path, classes: int = 60, dim: int = 16, sizes: dict | None = None, seed: int = 0, dtype=np.float16
) -> Path:
    """Class-clustered random embeddings in the extraction's layout (train/ and test/, complete)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(f"n{c:08d}" for c in range(classes)) + "\n")
    means = rng.normal(size=(classes, dim)) * 2
    for split, n in (sizes or {"train": 1200, "test": 300}).items():
        (root / split).mkdir(exist_ok=True)
        labels = rng.integers(0, classes, n)
        np.save(root / split / "embeddings.npy", (means[labels] + rng.normal(size=(n, dim))).astype(dtype))
        np.save(root / split / "labels.npy", labels.astype(np.int64))
    return root
