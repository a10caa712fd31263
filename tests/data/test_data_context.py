"""``topklab.engine.build.DATA_CONTEXT_KEYS`` names what a dataset may hand to a constructor (the checks
before Hydra starts skip the nodes that take one). It is a contract with every ``provides()`` in
src/topklab/data: each key a ``provides()`` returns must be listed, and each listed key provided somewhere."""

import ast

from helpers import ROOT
from topklab.engine.build import DATA_CONTEXT_KEYS

DATA = ROOT / "src" / "topklab" / "data"


def provided_keys() -> dict[str, set[str]]:
    """``{"<file>:<class>": keys}`` of the dict literals that each ``provides()`` under src/topklab/data returns."""
    found = {}
    for path in sorted(DATA.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "provides":
                        returns = [r.value for r in ast.walk(item) if isinstance(r, ast.Return)]
                        assert all(isinstance(r, ast.Dict) for r in returns), (
                            f"{path.name}:{node.name} returns a non-literal"
                        )
                        found[f"{path.name}:{node.name}"] = {k.value for r in returns for k in r.keys}
    return found


def test_every_provided_key_is_a_data_context_key_and_back():
    found = provided_keys()
    assert len(found) >= 5, found
    for where, keys in found.items():
        assert keys <= set(DATA_CONTEXT_KEYS), (
            f"{where} provides {sorted(keys - set(DATA_CONTEXT_KEYS))}: add to DATA_CONTEXT_KEYS"
        )
    assert set(DATA_CONTEXT_KEYS) <= set().union(*found.values()), "a DATA_CONTEXT_KEYS entry no Data provides"
