"""The data a run reads, as a fingerprint: its files' content by role, wherever they are, hashed once;
every dataset that reads files names them (tabular, listed images, embeddings, hub corpora included)."""

import importlib
import json
import os
import shutil

import numpy as np
import pytest
from hydra.utils import instantiate

from helpers import ROOT, TABULAR_DATASETS
from helpers.embedding_files import write_embeddings
from helpers.translation_files import write_hub_copy
from helpers.vision_files import tiny_listed, write_tree
from topklab.data import fingerprint as data_fingerprint
from topklab.data.embeddings import EmbeddingDataset
from topklab.data.fingerprint import DIGESTS_FILE, dataset_fingerprint, fingerprint
from topklab.data.translation import HubParallel, ParallelTextFiles
from topklab.data.vision import FashionMNIST
from topklab.utils.errors import DataUnavailableError

GENERATED = {"sinc"}  # dataset configs whose data is generated from their parameters


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / DIGESTS_FILE


def corpus(root, english="a man rides\n"):
    root.mkdir(parents=True)
    for split in ("train", "val", "test"):
        (root / f"{split}.de").write_text("ein Mann reitet\n")
        (root / f"{split}.en").write_text(english)
    return root


def test_the_fingerprint_is_the_content_by_role_not_the_place(tmp_path):
    here = corpus(tmp_path / "here")
    there = corpus(tmp_path / "there")
    shuffled = corpus(tmp_path / "shuffled", english="a woman rides\n")
    prints = [
        dataset_fingerprint(ParallelTextFiles(root=str(r), name="m", pair="de-en")) for r in (here, there, shuffled)
    ]
    assert prints[0] == prints[1] != prints[2] and len(prints[0]) == 16
    english = ParallelTextFiles(root=str(here), name="m", pair="en-en").data_files()
    assert sorted(english) == ["test.en", "train.en", "val.en"]  # one side of the corpus: its files only
    swapped = {"train.en": english["test.en"], "test.en": english["train.en"], "val.en": english["val.en"]}
    assert fingerprint(swapped) == fingerprint(english)  # same bytes in each role
    (here / "test.en").write_text("another sentence\n")  # train and test now differ: the roles count
    assert fingerprint(swapped) != fingerprint(english)


def _rewrite_keeping_size_and_times(path, text: str) -> None:
    """What ``cp -p``, ``rsync -a`` or ``tar x`` do to a file: new bytes, its size and times restored."""
    status = path.stat()
    assert len(text.encode()) == status.st_size
    path.write_text(text)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def test_a_small_file_is_hashed_each_time(tmp_path, cache):
    files = {"train.en": corpus(tmp_path / "c") / "train.en"}
    first = fingerprint(files)
    _rewrite_keeping_size_and_times(files["train.en"], "a man rode!\n")
    assert fingerprint(files) != first and not cache.exists()


def test_a_large_file_is_hashed_once_and_again_after_any_rewrite(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(data_fingerprint, "SMALL_FILE", 0)  # every file counts as large
    files = {"train.en": corpus(tmp_path / "c") / "train.en"}
    first = fingerprint(files)
    entry = json.loads(cache.read_text())[str(files["train.en"].resolve())]
    assert entry["size"] == len("a man rides\n") and {"inode", "mtime_ns", "ctime_ns"} <= set(entry)
    cached = {key: {**value, "sha256": "0" * 64} for key, value in json.loads(cache.read_text()).items()}
    cache.write_text(json.dumps(cached))  # a second run reads the digest, not the file
    assert fingerprint(files) != first
    _rewrite_keeping_size_and_times(files["train.en"], "a man rode!\n")  # the status-change time moves
    rewritten = fingerprint(files)
    assert rewritten != first
    assert json.loads(cache.read_text())[str(files["train.en"].resolve())]["sha256"] != "0" * 64
    copy = tmp_path / "copy.en"
    shutil.copy2(files["train.en"], copy)  # the same bytes under another inode: hashed, the same print
    assert fingerprint({"train.en": copy}) == rewritten


def test_missing_files_are_one_line_and_generated_data_has_none(tmp_path, fmnist_root):
    with pytest.raises(DataUnavailableError, match="Fashion-MNIST not found"):
        dataset_fingerprint(FashionMNIST(root=str(tmp_path / "none"), mean=[0.5], std=[0.5]))
    assert len(dataset_fingerprint(FashionMNIST(root=str(fmnist_root), mean=[0.5], std=[0.5]))) == 16
    with pytest.raises(DataUnavailableError, match=r"data file .*train.de \(train.de\) not found.*dataset.root"):
        fingerprint({"train.de": tmp_path / "train.de"})
    assert dataset_fingerprint(object()) is None


def test_the_suite_keeps_its_digests_out_of_the_users_cache():
    from pathlib import Path

    from topklab.data.fingerprint import cache_dir

    assert not cache_dir().is_relative_to(Path.home() / ".cache")


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs" / "dataset").glob("*.yaml")))
def test_every_dataset_config_names_the_files_it_reads(compose_cfg, name):
    module, _, attribute = compose_cfg(f"dataset={name}").dataset._target_.rpartition(".")
    assert callable(getattr(getattr(importlib.import_module(module), attribute), "data_files", None))


@pytest.mark.parametrize("name", TABULAR_DATASETS)
def test_a_tabular_benchmark_is_its_packaged_file(compose_cfg, name):
    dataset = instantiate(compose_cfg(f"dataset={name}").dataset)
    files = dataset.data_files()
    if name in GENERATED:
        assert files == {} and dataset_fingerprint(dataset) is None
        return
    assert len(files) == 1 and all(path.is_file() for path in files.values())
    assert dataset_fingerprint(dataset) == fingerprint(files) and len(dataset_fingerprint(dataset)) == 16
    if name == "spambase":  # the version it reads, not both
        assert list(files) == [{"uci4601": "spam.rda", "keel4597": "spambase.dat"}[dataset.splits().info["variant"]]]


def test_listed_images_are_their_split_lists_and_class_names(tmp_path):
    images, lists = write_tree(tmp_path / "a")
    data = tiny_listed(images, lists)
    assert sorted(data.data_files()) == ["classnames", "test.list", "train.list", "val.list"]
    first = dataset_fingerprint(data)
    moved = shutil.copytree(lists, tmp_path / "elsewhere")
    assert dataset_fingerprint(tiny_listed(images, moved)) == first
    (moved / "Tiny_train.txt").write_text((moved / "Tiny_train.txt").read_text().replace(" 1\n", " 2\n", 1))
    assert dataset_fingerprint(tiny_listed(images, moved)) != first  # a relabelled list is other data
    (moved / "Tiny_val.txt").unlink()
    with pytest.raises(DataUnavailableError, match=r"^split list .*Tiny_val.txt not found; ships with LIFT$"):
        dataset_fingerprint(tiny_listed(images, moved, list_source="ships with LIFT"))


def test_embeddings_are_their_classes_and_each_stored_splits_arrays(tmp_path):
    def embeddings(root):
        return EmbeddingDataset(root=str(root), name="tiny", holdout=100)

    root = write_embeddings(tmp_path / "e", classes=5, sizes={"train": 300, "test": 50})
    files = embeddings(root).data_files()
    assert sorted(files) == [
        "classes",
        "test.embeddings.npy",
        "test.labels.npy",
        "train.embeddings.npy",
        "train.labels.npy",
    ]
    first = dataset_fingerprint(embeddings(root))
    assert dataset_fingerprint(embeddings(shutil.copytree(root, tmp_path / "copy"))) == first
    labels = np.load(root / "train" / "labels.npy")
    np.save(root / "train" / "labels.npy", np.roll(labels, 1))
    assert dataset_fingerprint(embeddings(root)) != first
    with pytest.raises(DataUnavailableError, match="extract them first"):
        dataset_fingerprint(embeddings(tmp_path / "none"))


def test_a_hub_corpus_is_the_arrow_files_of_the_splits_it_reads(tmp_path):
    def hub(root, **kwargs):
        return HubParallel(
            path="wmt/wmt17", config_name="{pair}", pairs=["de-en"], root=str(root), name="wmt17",
            vocab_dir=str(tmp_path / "spm"), **kwargs,
        )  # fmt: skip

    root = write_hub_copy(tmp_path / "wmt17")
    files = hub(root).data_files()
    assert {role.split("/")[0] for role in files} == {"train", "validation", "test"}
    assert all(role.endswith(".arrow") and path.is_file() for role, path in files.items())
    held_out = hub(root, hub_splits={"train": "train", "val": None, "test": "validation"}, val_holdout=30)
    assert {role.split("/")[0] for role in held_out.data_files()} == {"train", "validation"}  # test is not read
    first = dataset_fingerprint(hub(root))
    assert dataset_fingerprint(hub(shutil.copytree(root, tmp_path / "copy"))) == first
    other = write_hub_copy(tmp_path / "other", sizes=(240, 24, 21))
    assert dataset_fingerprint(hub(other)) != first
