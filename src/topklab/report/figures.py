"""The STk paper's Figures 2-4 as PNG.

- Figure 2: ReLU against SReLU for δ ∈ {0.1, 0.05} (Eq. 2; drawn from the code, needs no run).
- Figure 3: the 2-D example, LDA boundary (dashed) and the boundaries learned with Average, ATk
  and STk, from the synthetic result ``figure3``.
- Figure 4: accuracy and ParaF1 against the negative-sample ratio (mean ± std over repeats), from
  the synthetic result ``figure4``, with the paper's approximate curve read off its plot.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from topklab.report.charts import device_of  # noqa: E402
from topklab.report.stats import mean_std  # noqa: E402
from topklab.smoothing import srelu  # noqa: E402

COLORS = {"Average": "tab:gray", "ATk": "tab:blue", "STk": "tab:red"}


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure2(path: Path) -> None:
    """ReLU and SReLU (Eq. 2) on [-0.3, 0.3].

    Examples
    --------
    >>> figure2(Path("/tmp/figure2.png"))  # doctest: +SKIP
    """
    x = torch.linspace(-0.3, 0.3, 601, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(x, torch.relu(x), "k-", label="ReLU")
    for delta, style in ((0.1, "--"), (0.05, ":")):
        ax.plot(x, srelu(x, delta), style, label=f"SReLU, δ = {delta}")
    ax.set(xlabel="x", ylabel="φ(x)", title="Figure 2: ReLU and SReLU (Eq. 2)")
    ax.legend()
    _save(fig, path)


def _line(ax, w, b, xs, **style):
    w1, w2 = w
    ax.plot(xs, [-(b + w1 * x) / w2 for x in xs], **style)


def k_of(boundary: dict) -> str:
    """``"k/n = 0.3, "`` for a boundary learned at a k (ATk, STk), ``""`` for one without (Average)."""
    return "" if boundary.get("k") is None else f"k/n = {boundary['k']:g}, "


def figure3(result: dict, path: Path) -> None:
    """The 2-D example from the synthetic result ``figure3`` (payload: points, lda, boundaries).

    Examples
    --------
    >>> figure3(read_result("results/synthetic/figure3.json"), Path("/tmp/figure3.png"))  # doctest: +SKIP
    """
    payload = result["result"]
    points = np.asarray(payload["points"]["x"], dtype=np.float32)
    labels = np.asarray(payload["points"]["y"], dtype=np.float32)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.scatter(*points[labels > 0].T, s=6, c="tab:red", alpha=0.5, label="positive (μ = [2, 2])")
    ax.scatter(*points[labels == 0].T, s=6, c="tab:blue", alpha=0.5, label="negative (μ = [0, 0])")
    lo, hi = float(points.min()) - 0.5, float(points.max()) + 0.5
    xs = [lo, hi]
    lda = payload["lda"]
    _line(
        ax,
        lda["w"],
        lda["b"],
        xs,
        color="k",
        ls="--",
        label=f"LDA (w*={[round(v, 3) for v in lda['w']]}, b*={lda['b']:.3f})",
    )
    for name, boundary in payload["boundaries"].items():
        _line(
            ax,
            boundary["w"],
            boundary["b"],
            xs,
            color=COLORS.get(name),
            label=f"{name} ({k_of(boundary)}test {boundary['test_acc']:.1f}%)",
        )
    trainer = result["config"].get("figure3", {}).get("trainer") or {}
    settled = "the state after training, no roll-back; " if trainer.get("report_state") == "last" else ""
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="x₁", ylabel="x₂")
    ax.set_title(f"Figure 3: 2-D example, prior 8:2\n({settled}{device_of([result])})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    _save(fig, path)


def figure4(result: dict, paper: dict, path: Path) -> None:
    """Sensitivity to the negative ratio from the synthetic result ``figure4`` (payload:
    negative_ratios, order, by_ratio) and ``paper["figure4"]``.

    Examples
    --------
    >>> figure4(read_result("results/synthetic/figure4.json"), paper, Path("/tmp/figure4.png"))  # doctest: +SKIP
    """
    payload, published_curves = result["result"], paper["figure4"]
    ratios = payload["negative_ratios"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, paper_key, label in (
        (axes[0], "test_acc", "accuracy_pct", "accuracy (%)"),
        (axes[1], "paraf1", "paraf1", "ParaF1"),
    ):
        for name in payload["order"]:
            means, stds = zip(*(mean_std(payload["by_ratio"][str(r)][name][key]) for r in ratios))
            ax.errorbar(
                ratios,
                means,
                yerr=stds,
                marker="o",
                capsize=3,
                color=COLORS.get(name),
                label=f"{name}, ours" + (" (Bayes support)" if key == "paraf1" else ""),
            )
            if key == "paraf1" and "paraf1_paper" in payload["by_ratio"][str(ratios[0])][name]:
                means = [mean_std(payload["by_ratio"][str(r)][name]["paraf1_paper"])[0] for r in ratios]
                ax.plot(ratios, means, ls="--", marker=".", color=COLORS.get(name), label=f"{name}, ours (paper's w*)")
            published = published_curves.get(paper_key, {}).get(name)
            if published:
                pairs = [(r, v) for r, v in zip(published_curves["negative_ratios"], published) if v is not None]
                ax.plot(
                    *zip(*pairs),
                    ls=":",
                    marker="x",
                    color=COLORS.get(name),
                    alpha=0.6,
                    label=f"{name}, paper (read off its plot)",
                )
        ax.set_xscale("log")
        ax.set(xlabel="negative-sample ratio in training", ylabel=label)
    axes[0].legend(fontsize=7)
    if "paraf1_paper" in payload["by_ratio"][str(ratios[0])][payload["order"][0]]:
        axes[1].set_title("solid: the Bayes support (11 coordinates); dashed: the paper's 10-entry w*", fontsize=8)
    scale = result["config"].get("scale", "paper")
    repeats = len(payload["by_ratio"][str(ratios[0])][payload["order"][0]]["test_acc"])
    grid = ", ".join(f"{k:g}" for k in result["config"].get("k_grid", []))
    fig.suptitle(
        f"Figure 4: sensitivity to the negative ratio ({device_of([result])}; mean ± population sd over n = {repeats}"
        f" repeats)\nk/n of ATk and STk chosen per ratio from {{{grid}}} on validation"
        + ("" if scale == "paper" else f"; MATk/STk at scale={scale}"),
        fontsize=11,
    )
    _save(fig, path)
