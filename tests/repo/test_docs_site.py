"""Documentation that cannot go stale: the MkDocs site (mkdocs.yml, docs/) builds with --strict (a
broken link or anchor, a page left out of the nav, a docstring the API pages cannot read fail it) and
shows at least eight figures drawn from results/; the README stays a short front page whose links
resolve; every section the long README had lives on in docs/; and the code the README and the pages
show runs as shown."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"

# The moved-sections contract: the `## ` titles of the README before it was cut to a front page.
# Each is a heading of some page under docs/ (a page's `#` title or a heading inside it).
OLD_README_SECTIONS = [
    "Use the losses in your own loop",
    "Train with Hydra",
    "Tables 3, 4 and 6 of the STk paper (tabular protocol)",
    "Section 4 of the STk paper: Table 1, Table 2, Figures 2–4, and the scaling benchmark",
    "Image classification: CIFAR-100(-LT), Fashion-MNIST-LT, top-k cross-entropy with P_K",
    "Differentiable top-k operators: one API, fast sorting networks, one benchmark",
    "STk as a layer: STk-threshold token routing and top-k gradient sparsification",
    "Machine translation: Multi30k here, IWSLT14 and WMT17 with a GPU",
    "Data (offline)",
    "Choices where the papers are silent (all config fields)",
    "What is bitwise reproducible, and where",
    "Bad input",
    "Tests",
    "Layout",
    "References",
]
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FIGURE = re.compile(r"!\[[^\]]*\]\((?:\.\./)*figures/([^)\s]+\.png)\)")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def doc_pages():
    return sorted(DOCS.rglob("*.md"))


def headings(text):
    """Heading titles outside fenced code blocks (a `# comment` inside ``` is not a heading)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return set(HEADING.findall(prose))


def test_the_site_builds_with_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            pytest.skip(f"{module} is not installed (requirements-cpu.txt or `pip install -e .[docs]`)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site"), "-f", "mkdocs.yml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    assert (tmp_path / "site" / "api" / "losses" / "index.html").read_text().count("STk") > 5
    pages = [page.read_text(encoding="utf-8") for page in (tmp_path / "site").rglob("*.html")]
    shown = {src for page in pages for src in re.findall(r'<img [^>]*src="(?:\.\./)*figures/([^"]+)"', page)}
    assert len(shown) >= 8, f"the site shows {len(shown)} figures: {sorted(shown)}"
    assert all((tmp_path / "site" / "figures" / name).is_file() for name in shown)


def test_the_pages_embed_committed_figures():
    """Each `![...](figures/<name>.png)` names a PNG `make figures` drew into results/figures/ (the site
    serves them as figures/, docs/hooks/figures.py), and at least eight are shown."""
    embedded = {name for page in doc_pages() for name in FIGURE.findall(page.read_text(encoding="utf-8"))}
    missing = sorted(name for name in embedded if not (ROOT / "results" / "figures" / name).is_file())
    assert not missing, f"pages embed figures that results/figures/ lacks (run `make figures`): {missing}"
    assert len(embedded) >= 8, f"the pages embed {len(embedded)} figures: {sorted(embedded)}"


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move sections into docs/"
    text = "\n".join(lines)
    for needed in ("make demo", "make test", "python train.py loss=stk dataset=cifar100lt"):
        assert needed in text
    assert re.search(r"make test .*\(\d+ min \d+ s on 2 quiet CPU cores, [0-9a-f]{7}\)", text), (
        "the suite's measured time"
    )


def test_every_old_readme_section_lives_in_docs():
    found = set().union(*(headings(page.read_text(encoding="utf-8")) for page in doc_pages()))
    missing = [title for title in OLD_README_SECTIONS if title not in found]
    assert not missing, f"sections of the old README with no heading under docs/: {missing}"


def test_the_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+://|#|mailto:", t)]
    assert any(t.startswith("docs/") for t in targets)
    broken = [t for t in targets if not (ROOT / t.partition("#")[0]).exists()]
    assert not broken, f"README.md links to missing files: {broken}"


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    left_out = [str(p.relative_to(DOCS)) for p in doc_pages() if str(p.relative_to(DOCS)) not in nav]
    assert not left_out, f"pages missing from mkdocs.yml's nav: {left_out}"


@pytest.mark.parametrize(
    "path",
    [
        "README.md",
        "docs/library.md",
        "docs/operators.md",
        "docs/layout.md",
        "docs/use-in-your-model.md",
        "docs/in-a-model.md",
        "docs/contracts.md",
    ],
)
def test_the_shown_code_runs(path):
    """Each ```python block runs in order in one namespace; `x`, `y` stand for the reader's batch."""
    import torch

    blocks = PYTHON_BLOCK.findall((ROOT / path).read_text(encoding="utf-8"))
    assert blocks, f"{path} shows no python code"
    torch.manual_seed(0)
    namespace = {"__name__": "docs_example", "x": torch.randn(16, 14), "y": torch.randint(0, 2, (16,)).float() * 2 - 1}
    for block in blocks:
        exec(compile(block, path, "exec"), namespace)  # noqa: S102 - the documentation's own examples
