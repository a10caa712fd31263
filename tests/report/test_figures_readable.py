"""Every figure `make figures` draws can be read: each is redrawn from the committed results (as
`render_figures` draws it) while every text artist it draws is recorded with its box in pixels, and
the test fails naming the figure and the two texts when two boxes overlap (tick labels, axis labels,
titles, legend entries, annotations) or when a text reaches past the figure's edge (a title cut off).
Each figure names its device (CPU or the GPU) and, where its rows aggregate a share of the losses,
the k/n; each figure in results/figures/ is embedded on a page under docs/."""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.figure  # noqa: E402
import matplotlib.text  # noqa: E402
import pytest  # noqa: E402

from helpers import ROOT  # noqa: E402

RESULTS, DOCS = ROOT / "results", ROOT / "docs"
SLACK = 0.5  # pixels two boxes may share at an edge (rounding of the text extents)
DEVICE = re.compile(r"\bCPU\b|NVIDIA|\bGPU\b")
FROM_CODE = {"figure2.png"}  # drawn from Eq. 2 alone: no data, no device


def _boxes_collide(a, b) -> bool:
    return (
        a.x0 + SLACK < b.x1 - SLACK
        and b.x0 + SLACK < a.x1 - SLACK
        and a.y0 + SLACK < b.y1 - SLACK
        and b.y0 + SLACK < a.y1 - SLACK
    )


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """``{figure name: [(text, box in pixels), ...], ...}`` for every figure `make figures` draws, each
    text as drawn into the saved PNG, with the saved figure's size."""
    from topklab.report.cli import render_figures

    texts, sizes, current = {}, {}, {}  # current: {text artist: (its text, its box)}, the last draw of each
    canvas = [0.0, 0.0]  # the saved image's width and height in pixels (savefig's dpi)
    draw_text, savefig = matplotlib.text.Text.draw, matplotlib.figure.Figure.savefig

    def recording_draw(self, renderer):
        draw_text(self, renderer)
        if self.get_visible() and self.get_text().strip():
            current[self] = (self.get_text(), self.get_window_extent(renderer))
            canvas[:] = renderer.get_canvas_width_height()

    def recording_savefig(self, fname, *args, **kwargs):
        current.clear()
        savefig(self, fname, *args, **kwargs)
        name = Path(fname).name.removeprefix(".").replace(".tmp.png", "")
        name = name if name.endswith(".png") else f"{name}.png"
        texts[name], sizes[name] = list(current.values()), tuple(canvas)

    patch = pytest.MonkeyPatch()
    patch.setattr(matplotlib.text.Text, "draw", recording_draw)
    patch.setattr(matplotlib.figure.Figure, "savefig", recording_savefig)
    try:
        written = render_figures(RESULTS, tmp_path_factory.mktemp("figures"))
    finally:
        patch.undo()
    assert sorted(written) == sorted(texts)
    return {name: (texts[name], sizes[name]) for name in written}


def test_every_committed_figure_is_redrawn(drawn):
    assert sorted(drawn) == sorted(p.name for p in (RESULTS / "figures").glob("*.png"))


def test_no_two_texts_of_a_figure_overlap(drawn):
    collisions = [
        f"{name}: {a!r} overlaps {b!r}"
        for name, (texts, _) in drawn.items()
        for i, (a, box_a) in enumerate(texts)
        for b, box_b in texts[i + 1 :]
        if _boxes_collide(box_a, box_b)
    ]
    assert not collisions, "\n".join(collisions)


def test_no_text_is_cut_at_the_figure_edge(drawn):
    cut = [
        f"{name}: {text!r} at x {box.x0:.0f}–{box.x1:.0f}, y {box.y0:.0f}–{box.y1:.0f} of {width:.0f} × {height:.0f}"
        for name, (texts, (width, height)) in drawn.items()
        for text, box in texts
        if box.x0 < -SLACK or box.y0 < -SLACK or box.x1 > width + SLACK or box.y1 > height + SLACK
    ]
    assert not cut, "\n".join(cut)


def test_each_figure_names_its_device(drawn):
    unnamed = [
        name
        for name, (texts, _) in drawn.items()
        if name not in FROM_CODE and not any(DEVICE.search(text) for text, _ in texts)
    ]
    assert not unnamed, f"these figures do not say whether they ran on a CPU or which GPU: {unnamed}"


def test_each_row_that_aggregates_a_share_of_the_losses_says_which_k(drawn):
    """A label naming STk or ATk (a row, a legend entry) comes with its k/n on the figure."""
    missing = [
        name
        for name, (texts, _) in drawn.items()
        if any(re.search(r"\b[SA]Tk\b", text) for text, _ in texts)
        and not any(re.search(r"k/n|k = ", text) for text, _ in texts)
    ]
    assert not missing, f"these figures show STk or ATk rows without their k/n: {missing}"


def test_the_overlap_check_finds_an_overlap_and_a_cut_title(tmp_path):
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(3, 2))
    first = axis.text(0.5, 0.5, "a label", transform=axis.transAxes)
    second = axis.text(0.52, 0.5, "another label", transform=axis.transAxes)
    title = figure.suptitle("a title far too long to fit across a figure three inches wide, cut at both ends")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in (first, second, title)]
    assert _boxes_collide(boxes[0], boxes[1])
    assert boxes[2].x0 < 0 and boxes[2].x1 > figure.bbox.width
    plt.close(figure)


def test_every_figure_is_embedded_on_a_page():
    embedded = {
        name
        for page in DOCS.rglob("*.md")
        for name in re.findall(r"\]\((?:\.\./)*figures/([^)\s]+\.png)\)", page.read_text())
    }
    missing = sorted(p.name for p in (RESULTS / "figures").glob("*.png") if p.name not in embedded)
    assert not missing, f"no page under docs/ embeds these figures: {missing}"
