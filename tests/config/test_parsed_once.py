"""The tests' config-file cache (``tests/conftest.py``): each YAML file is parsed once per path,
modification time and size, and every composition gets what a fresh parse would give."""

import os

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf


def test_a_file_is_parsed_once_reparsed_when_edited_and_each_composition_is_its_own(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    parses = []
    load = OmegaConf.load
    monkeypatch.setattr(OmegaConf, "load", lambda f: parses.append(getattr(f, "name", f)) or load(f))

    def composed():
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            return compose("run")

    def ours() -> int:
        return sum(os.path.realpath(name) == os.path.realpath(config) for name in parses)

    config.write_text("value: 1\nnested: {items: [1, 2]}\n")
    first = composed()
    first.nested["items"].append(3)  # a composition's change reaches no later one
    second = composed()
    assert ours() == 1 and second.value == 1 and list(second.nested["items"]) == [1, 2]
    stat = config.stat()
    config.write_text("value: 2\nnested: {items: [1, 2]}\n")  # the same size, a later modification time
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert composed().value == 2 and ours() == 2
    stat = config.stat()
    config.write_text("value: 30\nnested: {items: [1, 2]}\n")  # another size, the same modification time
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert composed().value == 30 and ours() == 3
