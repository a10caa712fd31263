"""Token routing (Mixture-of-Depths blocks): each router's selection rule, the routed block against a
slow per-sequence reference, causality, the STk threshold holding its capacity, and every routing
row end to end on a tiny corpus written in Multi30k's layout."""

import json
import math
from functools import partial

import pytest
import torch

from helpers import ROOT
from helpers.translation_files import write_text_corpus
from topklab.config import config_groups
from topklab.data.translation import PairBatch
from topklab.engine.run import train
from topklab.models import ProbabilityThresholdRouter, STkThresholdRouter, TopKRouter, TransformerLM
from topklab.models.language_model import causal_mask, run_routed
from topklab.models.transformer import EncoderLayer

ROUTERS = {
    "top_k": partial(TopKRouter, capacity=0.25),
    "threshold_p": partial(ProbabilityThresholdRouter, probability=0.5),
    "stk_threshold": partial(STkThresholdRouter, capacity=0.25),
}


def padded_tokens(lengths, vocab=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, :length] = torch.randint(4, vocab, (length,), generator=generator)
        tokens[row, 0] = 2
    return tokens


def test_top_k_sequence_scope_takes_the_ceil_of_c_times_each_sequence_length_of_its_highest_scores():
    router = TopKRouter(dim=4, capacity=0.3, scope="sequence")
    real = padded_tokens([10, 7, 3]) != 0
    scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    selected = router.top_k(scores, real) & real
    for row, length in enumerate([10, 7, 3]):
        expected = sorted(range(length), key=lambda j: -float(scores[row, j]))[: math.ceil(0.3 * length)]
        assert sorted(selected[row].nonzero().view(-1).tolist()) == sorted(expected)


def test_top_k_batch_scope_routes_exactly_c_of_the_batch():
    router = TopKRouter(dim=4, capacity=0.3)
    real = padded_tokens([10, 7, 3]) != 0
    scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    selected = router.top_k(scores, real) & real
    flat = [(float(scores[b, j]), b, j) for b in range(3) for j in range(10) if real[b, j]]
    expected = {(b, j) for _, b, j in sorted(flat, reverse=True)[: round(0.3 * 20)]}
    assert {tuple(i) for i in selected.nonzero().tolist()} == expected


def test_the_top_k_predictor_learns_the_selection_and_decides_at_inference():
    torch.manual_seed(0)
    router = TopKRouter(dim=8, capacity=0.25)
    optimizer = torch.optim.Adam(router.parameters(), lr=0.05)
    real = torch.ones(16, 32, dtype=torch.bool)
    for _ in range(200):
        x = torch.randn(16, 32, 8)
        router(x, real)
        optimizer.zero_grad()
        router.auxiliary_loss.backward()
        optimizer.step()
    x = torch.randn(16, 32, 8)
    with torch.no_grad():
        trained_rule = router.top_k(router.scores(x), real)
        router.eval()
        predicted, _ = router(x, real)
    assert float((predicted == trained_rule).float().mean()) > 0.9
    assert abs(float(predicted.float().mean()) - 0.25) < 0.05


def test_the_routed_block_equals_running_each_sequence_of_selected_tokens_alone():
    torch.manual_seed(0)
    layer = EncoderLayer(8, 16, 2, 0.0, 0.0, 0.0, True).double()
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    selected = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    gate = torch.rand(3, 6, dtype=torch.float64)
    out = run_routed(layer, x, selected, gate)
    for row in range(3):
        expected = x[row].clone()
        where = selected[row].nonzero().view(-1)
        if len(where):
            alone = x[row, where][None]
            processed = layer(alone, causal_mask(torch.ones(1, len(where), dtype=torch.bool)))[0]
            expected[where] += gate[row, where, None] * (processed - alone[0])
        torch.testing.assert_close(out[row], expected)


@pytest.mark.parametrize("name", ROUTERS)
def test_threshold_routing_is_causal_and_top_k_is_not(name):
    torch.manual_seed(0)
    model = TransformerLM(
        vocab_size=20, d_model=16, ffn_dim=32, heads=2, layers=2, dropout=0.0, router=ROUTERS[name]
    ).eval()
    tokens = padded_tokens([12])
    with torch.no_grad():
        full = model(PairBatch(tokens[:, :0], tokens))
        prefixes = torch.cat([model(PairBatch(tokens[:, :0], tokens[:, :t]))[:, -1:] for t in range(1, 13)], 1)
    assert model.causal
    assert torch.allclose(full, prefixes, atol=1e-5)


def test_top_k_at_inference_is_not_causal_without_its_predictor():
    torch.manual_seed(0)
    model = TransformerLM(
        vocab_size=20,
        d_model=16,
        ffn_dim=32,
        heads=2,
        layers=2,
        dropout=0.0,
        router=partial(TopKRouter, capacity=0.25, inference="top_k"),
    ).eval()
    tokens = padded_tokens([12])
    with torch.no_grad():
        full = model(PairBatch(tokens[:, :0], tokens))
        prefixes = torch.cat([model(PairBatch(tokens[:, :0], tokens[:, :t]))[:, -1:] for t in range(1, 13)], 1)
    assert not model.causal and not torch.allclose(full, prefixes, atol=1e-5)


def test_the_paper_update_stk_threshold_lets_the_capacity_through_on_static_scores():
    """Only λ trains (SGD on the auxiliary term over fixed score distributions): the fraction of
    tokens above λ settles at c, unlike a fixed threshold, which lets through whatever lies above it."""
    torch.manual_seed(0)
    router = STkThresholdRouter(dim=8, capacity=0.25, delta=0.01, lam_update="gradient", lam_init=0.0, input_norm=False)
    optimizer = torch.optim.SGD([router.lam], lr=0.5)
    real = torch.ones(16, 32, dtype=torch.bool)
    fractions = []
    for _ in range(400):
        x = torch.randn(16, 32, 8) + 0.5
        selected, _ = router(x, real)
        optimizer.zero_grad()
        router.auxiliary_loss.backward()
        optimizer.step()
        fractions.append(float(selected.float().mean()))
    assert abs(sum(fractions[-100:]) / 100 - 0.25) < 0.02
    fixed, _ = ProbabilityThresholdRouter(dim=8, probability=0.75, input_norm=False)(torch.randn(16, 32, 8) + 0.5, real)
    assert abs(float(fixed.float().mean()) - 0.25) > 0.05


def test_the_solved_stk_threshold_holds_its_capacity_while_the_scores_drift():
    """Scores that drift by 0.1 per step (15-45 times what an Adam-trained λ moves): the solved λ routes
    within [0.8c, 1.2c] of (almost) every training batch of 512 tokens (two Newton steps from the last
    root; a batch's count is a staircase in λ) and c on average, and the running average routes about c
    of held-out batches once the drift stops."""
    torch.manual_seed(0)
    router = STkThresholdRouter(dim=1, capacity=0.125, input_norm=False)
    _ = router.score.weight.data.fill_(1.0), router.score.bias.data.zero_()
    real = torch.ones(8, 64, dtype=torch.bool)
    fractions = []
    for step in range(300):
        drift = 0.1 * min(step, 200)
        selected, _ = router(torch.randn(8, 64, 1) + drift, real)
        fractions.append(float(selected.float().mean()))
    assert sum(0.8 * 0.125 <= f <= 1.2 * 0.125 for f in fractions) >= 0.98 * len(fractions)
    assert abs(sum(fractions) / len(fractions) - 0.125) < 0.01 * 0.125
    router.eval()
    held_out = [float(router(torch.randn(8, 64, 1) + 20.0, real)[0].float().mean()) for _ in range(20)]
    assert 0.8 * 0.125 <= sum(held_out) / 20 <= 1.2 * 0.125
    assert router.pop_training_fraction() == pytest.approx(sum(fractions) / len(fractions))


def test_the_stk_threshold_starts_at_the_first_batch_quantile_and_the_paper_update_trains_in_its_own_group():
    torch.manual_seed(0)
    paper = partial(STkThresholdRouter, capacity=0.25, lam_update="gradient", lam_lr=0.05)
    model = TransformerLM(vocab_size=20, d_model=16, ffn_dim=32, heads=2, layers=2, router=paper)
    router, tokens = model.routers["1"], padded_tokens([12, 12, 12, 12])
    assert not router.lam_started
    model(PairBatch(tokens[:, :0], tokens))
    assert router.lam_started and abs(float((model.last_routed[:, 0].sum()) / 48) - 0.25) <= 1 / 48
    restored = TransformerLM(vocab_size=20, d_model=16, ffn_dim=32, heads=2, layers=2, router=paper)
    restored.load_state_dict(model.state_dict())
    assert restored.routers["1"].lam_started and restored.routers["1"].lam.item() == router.lam.item()
    groups = model.parameter_groups()
    assert groups[1] == {"params": [router.lam], "weight_decay": 0.0, "lr": 0.05, "constant_lr": True}  # the rule's
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 0.05]
    solved = TransformerLM(vocab_size=20, d_model=16, ffn_dim=32, heads=2, layers=2, router=ROUTERS["stk_threshold"])
    assert len(solved.parameter_groups()) == 1 and "routers.1.lam" in solved.state_dict()


def test_the_routers_auxiliary_terms_reach_the_training_objective():
    from topklab.engine.objective import Objective
    from topklab.losses import Average, LabelSmoothedCrossEntropy

    for router, trained in (
        (partial(STkThresholdRouter, capacity=0.25, lam_update="gradient"), "lam"),
        (ROUTERS["top_k"], "predictor.weight"),
    ):
        model = TransformerLM(vocab_size=20, d_model=16, ffn_dim=32, heads=2, layers=2, router=router)
        tokens = padded_tokens([9, 5])
        objective = Objective(LabelSmoothedCrossEntropy(smoothing=0.0), Average())
        objective(model(PairBatch(tokens[:, :0], tokens)), tokens, model).backward()
        grad = model.routers["1"].get_parameter(trained).grad
        assert grad is not None and bool((grad != 0).any())


def test_bad_router_settings_get_one_line_errors():
    with pytest.raises(ValueError, match="capacity"):
        TopKRouter(dim=4, capacity=0.0)
    with pytest.raises(ValueError, match="lam_init"):
        STkThresholdRouter(dim=4, lam_init="median")
    with pytest.raises(ValueError, match="lam_lr"):
        STkThresholdRouter(dim=4, lam_update="gradient", lam_lr=0.0)
    with pytest.raises(ValueError, match="lam_lr"):
        STkThresholdRouter(dim=4, lam_lr=0.01)  # the solved λ has no learning rate
    with pytest.raises(ValueError, match="lam_update"):
        STkThresholdRouter(dim=4, lam_update="adam")
    with pytest.raises(ValueError, match="scope"):
        TopKRouter(dim=4, scope="sentence")
    with pytest.raises(ValueError, match="probability"):
        ProbabilityThresholdRouter(dim=4, probability=1.0)
    with pytest.raises(ValueError, match="routed_layers"):
        TransformerLM(vocab_size=20, d_model=16, heads=2, layers=2, router=ROUTERS["top_k"], routed_layers=[5])


def routing_rows():
    return [row for row in config_groups(ROOT / "configs")["experiment"] if row.startswith("routing/")]


def test_every_routing_cell_has_a_row():
    assert set(routing_rows()) == {"routing/dense", "routing/stk_threshold_c0125_lam0_model_lr"} | {
        f"routing/{r}_c{c}" for r in ("top_k", "threshold_p", "stk_threshold") for c in ("0125", "025", "05")
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("multi30k")
    return write_text_corpus(base / "multi30k"), base / "spm"


@pytest.mark.integration
@pytest.mark.parametrize("row", routing_rows())
def test_routing_row_composes_and_smoke_runs_offline(compose_cfg, tmp_path, corpus, row):
    root, spm = corpus
    result = tmp_path / "result.json"
    cfg = compose_cfg(
        f"experiment={row}",
        f"dataset.root={root}",
        f"dataset.vocab_dir={spm}",
        "dataset.vocab_size=40",
        "model.d_model=16",
        "model.ffn_dim=32",
        "model.heads=2",
        "engine.max_steps=2",
        "engine.batch_size=128",
        "logger=none",
        f"result_file={result}",
        f"paths.log_dir={tmp_path}",
    )
    assert cfg.recipe == "language_modeling"
    summary = train(cfg, tmp_path / "run")
    test = summary["metrics"]["test"]
    assert summary["steps"] == 2 and test["perplexity"] == pytest.approx(math.exp(test["loss"]))
    assert (test["routed_fraction"] is None) == (row == "routing/dense")
    if row.startswith("routing/top_k"):
        assert 0 < test["routed_fraction"] < 1
    assert json.loads(result.read_text())["result"]["label"] == cfg.row
