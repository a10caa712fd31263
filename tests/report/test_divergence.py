"""A run whose training loss spikes is left out of its vision row's means and named under the table."""

import pytest

from helpers.tables import fake_vision_run
from topklab.report.divergence import loss_spike
from topklab.report.schema import read_results
from topklab.report.vision import by_table, render_vision_table
from topklab.utils.errors import TopklabError


def test_a_spike_is_a_rise_above_the_factor_times_the_lowest_earlier_epoch():
    history = [{"epoch": e, "train_loss": v} for e, v in enumerate([2.6, 2.2, 1.0, 1.9, 0.9], start=1)]
    assert loss_spike(history) is None  # 1.9 < 2 × 1.0: the noise of early epochs is no divergence
    history.append({"epoch": 6, "train_loss": 1.81})
    assert loss_spike(history) == {"epoch": 6, "train_loss": 1.81, "lowest_before": 0.9}
    assert loss_spike([{"epoch": 1, "train_loss": None}, {"epoch": 2, "train_loss": 5.0}]) is None
    with pytest.raises(TopklabError, match="must be > 1"):
        loss_spike(history, factor=1.0)


def test_a_diverged_seed_is_left_out_of_the_means_and_named(tmp_path):
    steady = [2.0, 1.2, 0.8, 0.6]
    for seed, top1 in enumerate([70.0, 72.0]):
        fake_vision_run(tmp_path, "t", "stk", "STk", seed, top1, 95.0, [80.0, 60.0, 40.0], steady)
    fake_vision_run(tmp_path, "t", "stk", "STk", 2, 30.0, 90.0, [50.0, 20.0, 0.0], [2.0, 1.4, 3.5, 0.9])
    runs = read_results(tmp_path / "vision", "vision")
    text = render_vision_table("t", by_table(runs)["t"])
    assert "| STk | 2 (+1 diverged) | 71.00 ± 1.00 |" in text
    assert "STk seed 2 (epoch 3: 3.50 after 1.40; top-1 30.00)" in text
    assert "| STk | 70.00 | 72.00 | 30.00 (diverged) |" in text
    assert "| STk | 80.0 | 60.0 | 40.0 |" in text  # per-class means without the diverged seed


def test_the_seed_strip_draws_a_diverged_seed_apart_and_leaves_it_out_of_the_mean(tmp_path):
    from topklab.report.charts import strip_values
    from topklab.report.vision import top1

    for seed, value in enumerate([70.0, 72.0]):
        fake_vision_run(tmp_path, "t", "stk", "STk", seed, value, 95.0, [80.0, 60.0, 40.0], [2.0, 1.2, 0.8, 0.6])
    fake_vision_run(tmp_path, "t", "stk", "STk", 2, 30.0, 90.0, [50.0, 20.0, 0.0], [2.0, 1.4, 3.5, 0.9])
    runs = by_table(read_results(tmp_path / "vision", "vision"))["t"]["stk"]
    kept, dropped = strip_values(runs, top1)
    assert sorted(kept) == [70.0, 72.0] and dropped == [30.0]
