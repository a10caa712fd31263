"""Write the STk paper's Figures 2-4 to results/figures/ (reads only results/).

    python scripts/make_figures.py [--results results] [--out results/figures]

- figure2.png: ReLU against SReLU for δ ∈ {0.1, 0.05} (Eq. 2; needs no run).
- figure3.png: the 2-D example, LDA boundary (dashed) and the boundaries learned with Average,
  ATk and STk, from results/synthetic/figure3.json (`scripts/reproduce_synthetic.py`).
- figure4.png: accuracy and ParaF1 against the negative-sample ratio (mean ± std over repeats),
  from results/synthetic/figure4.json, with the paper's approximate curve read off its plot.
A figure whose JSON is missing is skipped with a note.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from topklab.losses.smoothing import srelu  # noqa: E402
from topklab.synthetic.tables import mean_std  # noqa: E402

COLORS = {"Average": "tab:gray", "ATk": "tab:blue", "STk": "tab:red"}


def figure2(path: Path) -> None:
    x = torch.linspace(-0.3, 0.3, 601, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(x, torch.relu(x), "k-", label="ReLU")
    for delta, style in ((0.1, "--"), (0.05, ":")):
        ax.plot(x, srelu(x, delta), style, label=f"SReLU, δ = {delta}")
    ax.set(xlabel="x", ylabel="φ(x)", title="Figure 2: ReLU and SReLU (Eq. 2)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _line(ax, w, b, xs, **style):
    w1, w2 = w
    ax.plot(xs, [-(b + w1 * x) / w2 for x in xs], **style)


def figure3(result: dict, path: Path) -> None:
    points = torch.tensor(result["points"]["x"])
    labels = torch.tensor(result["points"]["y"])
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.scatter(*points[labels > 0].T, s=6, c="tab:red", alpha=0.5, label="positive (μ = [2, 2])")
    ax.scatter(*points[labels == 0].T, s=6, c="tab:blue", alpha=0.5, label="negative (μ = [0, 0])")
    lo, hi = float(points.min()) - 0.5, float(points.max()) + 0.5
    xs = [lo, hi]
    lda = result["lda"]
    _line(ax, lda["w"], lda["b"], xs, color="k", ls="--", label=f"LDA (w*={[round(v, 3) for v in lda['w']]}, "
                                                                  f"b*={lda['b']:.3f})")
    for name, boundary in result["boundaries"].items():
        _line(ax, boundary["w"], boundary["b"], xs, color=COLORS.get(name), label=f"{name} (test {boundary['test_acc']:.1f}%)")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="x₁", ylabel="x₂", title="Figure 3: 2-D example, prior 8:2")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure4(result: dict, paper: dict, path: Path) -> None:
    ratios = result["negative_ratios"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, paper_key, label in ((axes[0], "test_acc", "accuracy_pct", "accuracy (%)"),
                                      (axes[1], "paraf1", "paraf1", "ParaF1")):
        for name in result["order"]:
            means, stds = zip(*(mean_std(result["by_ratio"][str(r)][name][key]) for r in ratios))
            ax.errorbar(ratios, means, yerr=stds, marker="o", capsize=3, color=COLORS.get(name), label=f"{name}, ours")
            published = paper.get(paper_key, {}).get(name)
            if published:
                pairs = [(r, v) for r, v in zip(paper["negative_ratios"], published) if v is not None]
                ax.plot(*zip(*pairs), ls=":", marker="x", color=COLORS.get(name), alpha=0.6,
                        label=f"{name}, paper (read off its plot)")
        ax.set_xscale("log")
        ax.set(xlabel="negative-sample ratio in training", ylabel=label)
    axes[0].legend(fontsize=7)
    fig.suptitle("Figure 4: sensitivity to the negative ratio (mean ± std over repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/figures")
    args = parser.parse_args(argv)
    out = args.out or args.results / "figures"
    out.mkdir(parents=True, exist_ok=True)
    paper = yaml.safe_load((args.results / "paper" / "stk_neurips2024.yaml").read_text())
    written = []
    figure2(out / "figure2.png")
    written.append("figure2.png")
    for name, draw in (("figure3", figure3), ("figure4", lambda r, p: figure4(r, paper["figure4"], p))):
        source = args.results / "synthetic" / f"{name}.json"
        if not source.exists():
            print(f"note: {source} not found; run scripts/reproduce_synthetic.py first ({name}.png skipped)")
            continue
        try:
            result = json.loads(source.read_text())
        except ValueError as err:
            print(f"error: {source} is corrupt ({err}); rerun scripts/reproduce_synthetic.py", file=sys.stderr)
            return 2
        tmp = out / f".{name}.tmp.png"
        draw(result, tmp)
        tmp.replace(out / f"{name}.png")
        written.append(f"{name}.png")
    print(f"wrote {', '.join(written)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
