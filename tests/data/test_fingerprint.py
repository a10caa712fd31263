"""The data a run reads, as a fingerprint: its files' content by role, wherever they are, hashed once."""

import json

import pytest

from topklab.data.fingerprint import DIGESTS_FILE, dataset_fingerprint, fingerprint
from topklab.data.translation import ParallelTextFiles
from topklab.data.vision import FashionMNIST
from topklab.utils.errors import DataUnavailableError


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


def test_a_file_is_hashed_once_for_its_path_size_and_mtime(tmp_path, cache):
    files = {"train.en": corpus(tmp_path / "c") / "train.en"}
    first = fingerprint(files)
    entry = json.loads(cache.read_text())[str(files["train.en"].resolve())]
    assert entry["size"] == len("a man rides\n")
    cached = {key: {**value, "sha256": "0" * 64} for key, value in json.loads(cache.read_text()).items()}
    cache.write_text(json.dumps(cached))  # a second run reads the digest, not the file
    assert fingerprint(files) != first
    files["train.en"].write_text("a man rides!\n")  # another size: hashed again
    again = fingerprint(files)
    assert again != first and json.loads(cache.read_text())[str(files["train.en"].resolve())]["size"] == 13


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
