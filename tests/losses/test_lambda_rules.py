"""λ's rules (topklab.losses.aggregate.lambda_rules): the one table of names, each rule applied alike by
every holder (the loss module, the population executor's members, the router), and the edges where λ is
set to the k-th largest loss."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from topklab.losses import MATk, STk
from topklab.losses.aggregate import lambda_rules
from topklab.losses.aggregate.lambda_monitor import in_band
from topklab.losses.aggregate.lambda_rules import RULES, rule_for, split_tie_mass
from topklab.models.routing import STkThresholdRouter

SRC = Path(__file__).resolve().parents[2] / "src" / "topklab"
STORED = [name for name, rule in RULES.items() if rule.stored]


def test_no_rule_name_is_decided_outside_the_rules_module():
    names = set(RULES)
    bound = {name for name, value in vars(lambda_rules).items() if isinstance(value, str) and value in names}
    found = []

    def named(node) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in names
        if isinstance(node, ast.Name):
            return node.id in bound
        if isinstance(node, ast.Attribute):
            return node.attr in bound
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(element) for element in node.elts)
        return False

    for path in sorted(SRC.rglob("*.py")):
        if path.name == "lambda_rules.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            places = []
            if isinstance(node, ast.Compare):
                places = [node.left, *node.comparators]
            elif isinstance(node, ast.match_case):
                places = [p.value for p in ast.walk(node.pattern) if isinstance(p, ast.MatchValue)]
            elif isinstance(node, ast.Dict):
                places = [key for key in node.keys if key is not None]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                places = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            elif isinstance(node, ast.ClassDef):
                places = [s.value for s in node.body if isinstance(s, ast.AnnAssign) and s.value is not None]
            found += [f"{path.relative_to(SRC)}:{place.lineno}" for place in places if named(place)]
    assert not found, f"rule names decided outside lambda_rules.py: {found}"


@pytest.mark.parametrize("k", [1, 2])
def test_matk_at_the_kth_loss_has_atk_s_gradient(k):
    x = torch.tensor([1.0, 5.0, 3.0, 0.0], requires_grad=True)
    expected = {1: [0, 0.25, 0, 0], 2: [0, 0.25, 0.25, 0]}[k]
    for rule in ("solve", "adaptive", "track"):  # track: its first call is solved
        module = MATk(k=k, lam_update=rule)
        (grad,) = torch.autograd.grad(module(x), x)
        assert grad.tolist() == expected, rule
    solved = MATk(k=k, lam_update="solve")
    solved(x.detach())  # started: the next call takes the C++ lane
    (grad,) = torch.autograd.grad(solved(x), x)
    assert grad.tolist() == expected


def test_tied_losses_at_the_kth_share_the_missing_mass():
    tied = torch.tensor([1.0, 3.0, 3.0, 0.0], requires_grad=True)
    for module in (MATk(k=2, lam_update="solve"), MATk(k=2, lam_update="gradient"), MATk(k=2, kernel="eager")):
        (grad,) = torch.autograd.grad(module(tied), tied)
        assert grad.tolist() == [0, 0.25, 0.25, 0]
    three = torch.tensor([3.0, 3.0, 3.0, 0.0], requires_grad=True)
    (grad,) = torch.autograd.grad(MATk(k=2, lam_update="solve")(three), three)
    torch.testing.assert_close(grad, torch.tensor([1 / 6, 1 / 6, 1 / 6, 0.0]))
    assert (
        split_tie_mass(three.detach()[None], torch.tensor([3.0]), torch.tensor([2.0]), torch.tensor([0.25])).sum()
        == 0.5
    )


def test_matk_solve_gradcheck_on_distinct_losses():
    module = MATk(k=3, lam_update="solve", kernel="eager")
    x = torch.tensor([0.3, 2.0, 1.1, 4.2, 0.9, 3.3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


def test_the_australian_matk_k1_command_trains(compose_cfg, tmp_path):
    from topklab.engine.run import train  # noqa: PLC0415

    base = ("experiment=stk/table3/australian", "runner=model", "loss=matk", "loss.k=1")
    solved = train(compose_cfg(*base), tmp_path / "solve")
    trained = train(compose_cfg(*base, "loss.lam_update=gradient"), tmp_path / "gradient")
    error = {name: run["metrics"]["test"]["error_pct"] for name, run in (("solve", solved), ("gradient", trained))}
    assert solved["best_step"] > 0 and abs(error["solve"] - error["gradient"]) <= 2, error
    assert solved["lambda_tracking"]["in_band"] >= 0.9 and solved["lambda_tracking"]["flag"] is None


def _batches(n=32, calls=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, generator=generator, dtype=torch.float64) * (3 - 0.15 * i)).exp() for i in range(calls)]


@pytest.mark.parametrize("name", STORED)
@pytest.mark.parametrize("loss", ["stk", "matk"])
def test_every_holder_applies_a_rule_as_the_module_does(name, loss):
    """The module (float64 buffers, the reference), the population executor's member step and the
    router follow one rule alike, or refuse in one line."""
    build = (
        (lambda: STk(k=8, delta=0.05, lam_init=0.0, lam_update=name))
        if loss == "stk"
        else (lambda: MATk(k=8, lam_init=0.0, lam_update=name))
    )
    module = build().double()
    holder = build()
    lam = torch.zeros(1, dtype=torch.float64)
    delta = torch.full((1,), 0.05 if loss == "stk" else 0.0, dtype=torch.float64)
    k = torch.full((1,), 8.0, dtype=torch.float64)
    refused = None
    for step, losses in enumerate(_batches()):
        used_by_module = module.lam_last.clone()
        module(losses.requires_grad_())
        try:
            used, stored, _ = holder.rule.member_lam(holder, losses[None], k, delta, lam, step == 0)
        except ValueError as error:
            refused = str(error)
            break
        torch.testing.assert_close(used, (module.lam_last if step == 0 or not module.rule.uses_last(module, 32)
                                          else used_by_module).view(1), rtol=1e-12, atol=1e-12)  # fmt: skip
        torch.testing.assert_close(stored, module.lam_last.view(1), rtol=1e-12, atol=1e-12)
        lam = stored
    if refused is not None:
        assert loss == "matk" and "\n" not in refused and "population executor" in refused
    if loss == "stk":  # the router: scores with capacity 8/32
        router = STkThresholdRouter(dim=2, capacity=0.25, delta=0.05, lam_update=name, lam_init=0.0).double()
        reference = (STk(k=8, delta=0.05, lam_init=0.0, lam_update=name, kernel="eager")).double()
        for losses in _batches():
            before, behind = reference.lam_last.clone(), reference.rule.uses_last(reference, 32)  # one call behind
            reference(losses.clone().requires_grad_())
            used = router._stored_lam(losses)
            torch.testing.assert_close(used, before if behind else reference.lam_last, rtol=1e-12, atol=1e-12)
            for name in ("lam_last", "lam"):  # the warm start and the running average (λ at inference)
                torch.testing.assert_close(getattr(router, name), getattr(reference, name), rtol=1e-12, atol=1e-12)


def test_the_trained_rule_has_no_member_lambda_and_the_router_takes_it():
    holder = STk(k=4, lam_update="gradient")
    assert holder.rule.member_lam(holder, torch.ones(1, 8), torch.ones(1), torch.ones(1), torch.zeros(1), True) is None
    assert not STkThresholdRouter(dim=2, lam_update="gradient").rule.stored
    with pytest.raises(ValueError, match="router.unknown lam_update 'newton'"):
        STkThresholdRouter(dim=2, lam_update="newton")


def test_the_population_executor_follows_track_not_gradient():
    from topklab.engine.population import PopulationExecutor  # noqa: PLC0415

    executor = PopulationExecutor.__new__(PopulationExecutor)
    executor.aggregate = STk(0.5, lam_update="track")
    assert executor.aggregate.rule.stored  # the executor sets λ by the rule: nothing for the optimizer


def test_batched_rows_each_get_their_own_root_and_the_monitor_judges_rows():
    generator = torch.Generator().manual_seed(1)
    scales = torch.linspace(1, 3, 8)[:, None]
    module = STk(k=0.25, lam_update="solve")
    for _ in range(20):
        rows = torch.rand(8, 64, generator=generator) * scales
        module(rows.requires_grad_())
    shares = []
    for _ in range(20):
        rows = torch.rand(8, 64, generator=generator) * scales
        module.train()
        lam, _, _ = module.rule.training_lam(module, rows, torch.full((8,), 16.0), 16, torch.full((8,), 0.01))
        shares.append(module._row_shares(rows, lam))
    assert bool(in_band(torch.cat(shares), 0.25).all())
    monitor = module.monitor
    assert bool(monitor.rows_in_band(torch.tensor([0.25, 0.9]), torch.tensor([0.25, 0.25]))) is False


@pytest.mark.parametrize("n", [16, 64, 128])
def test_the_library_default_is_in_band_on_small_iid_batches(n):
    generator = torch.Generator().manual_seed(n)
    for k in (0.1, 0.9):
        module = STk(k=k)
        for _ in range(100):
            module(torch.rand(n, generator=generator).mul(3).requires_grad_()).backward()
        assert module.monitor.pop_epoch()["lam_in_band_all"] >= 0.9


def test_changing_k_invalidates_the_cached_count():
    module = MATk(k=1, lam_update="solve")
    x = torch.arange(10.0)
    assert module(x).item() == pytest.approx(0.9)
    module.k = 1.0
    assert module(x).item() == pytest.approx(4.5)


def test_a_fresh_modules_state_dict_leaves_its_target_fresh():
    target = STk(k=0.5)
    target.load_state_dict(STk(k=0.5).state_dict())
    assert not target._started and not bool(target.lam_started)
    losses = 1000 + torch.rand(64)
    target(losses.requires_grad_())
    assert 999 < float(target.lam_last) < 1001  # started on these losses, not at λ = 0 (the Average objective)
    started = STk(k=0.5)
    started.load_state_dict(target.state_dict())
    assert started._started
    old = {name: value for name, value in target.state_dict().items() if name != "lam_started"}  # saved before
    STk(k=0.5).load_state_dict(old)  # a saved λ without the flag is a started one


def test_torch_func_grad_works_outside_training_and_refuses_in_one_line_inside():
    module = STk(k=0.5)
    x = torch.rand(16)
    module(x.clone().requires_grad_())
    module.eval()
    grad = torch.func.grad(module)(x)
    (expected,) = torch.autograd.grad(
        module(x.clone().requires_grad_()), [x.clone().requires_grad_()], allow_unused=True
    )
    assert grad.shape == x.shape and torch.isfinite(grad).all()
    leaf = x.clone().requires_grad_()
    (autograd,) = torch.autograd.grad(module(leaf), leaf)
    torch.testing.assert_close(grad, autograd)
    module.train()
    with pytest.raises(Exception, match="torch.func transforms forbid") as error:
        torch.func.grad(module)(x)
    assert "\n" not in str(error.value)


def test_to_moves_all_state_after_a_call():
    module = STk(k=0.5)
    module(torch.rand(16).requires_grad_())
    moved = copy.deepcopy(module).to("meta")
    assert moved.monitor._state.device.type == "meta" and moved.lam.device.type == "meta"
    halved = copy.deepcopy(module).half()
    assert halved.monitor._state.dtype == torch.float64


def test_rule_table_names_and_instances():
    assert rule_for(None).name == lambda_rules.DEFAULT
    rule = rule_for("solve", solve_steps=3)
    assert rule_for(rule) is rule and STk(k=2, lam_update=rule).rule is rule
    with pytest.raises(ValueError, match="unknown lam_update 'newton'; choose one of"):
        STk(k=2, lam_update="newton")


@pytest.mark.parametrize("name", list(RULES))
def test_the_tabular_preset_takes_every_rule_and_keeps_the_papers_fingerprint(name):
    from hydra.utils import instantiate  # noqa: PLC0415

    from topklab.engine.aggregates import aggregate_config  # noqa: PLC0415
    from topklab.protocol.cell import Protocol  # noqa: PLC0415
    from topklab.protocol.grid import Grid  # noqa: PLC0415

    protocol = Protocol(grid=Grid(k=[0.5], C=[10.0], lr=[0.1], delta=[0.01]), lam_update=name)
    module = instantiate(protocol.members_aggregate(aggregate_config("stk")))
    assert module.lam_update == name and module.lam_lr is None
    fingerprint = protocol.fingerprint("stk")
    assert ("lam_update" in fingerprint) == RULES[name].stored  # the paper's update: as stored before the field
    assert "lam_update" not in Protocol(grid=protocol.grid).fingerprint("stk")


def test_an_unknown_rule_is_a_one_line_error_everywhere():
    from topklab.protocol.cell import Protocol  # noqa: PLC0415
    from topklab.protocol.grid import Grid  # noqa: PLC0415
    from topklab.utils.errors import TopklabError  # noqa: PLC0415

    with pytest.raises(TopklabError, match="preset.lam_update='newton'; choose one of: track, solve"):
        Protocol(grid=Grid(k=[0.5], C=[10.0], lr=[0.1], delta=[0.01]), lam_update="newton")
    for build in (lambda: STk(k=2, lam_update="newton"), lambda: MATk(k=2, lam_update="newton")):
        with pytest.raises(
            ValueError, match="^unknown lam_update 'newton'; choose one of: track, solve, adaptive, gradient$"
        ):
            build()


def test_a_rule_object_takes_no_settings_from_the_module():
    from topklab.losses.aggregate.lambda_rules import Solved  # noqa: PLC0415

    module = STk(k=0.5, lam_update=Solved(solve_steps=8, lam_momentum=0.5))
    assert (module.solve_steps, module.lam_momentum) == (8, 0.5)
    with pytest.raises(ValueError, match="^lam_update is a rule object .*; give lam_lr, solve_steps to the rule"):
        STk(k=0.5, lam_update=Solved(), lam_lr=0.1, solve_steps=8)


def test_shared_rows_started_at_their_pooled_kth_loss_get_no_tie_mass():
    x = torch.tensor([[6.0, 5.0, 4.0, 0.0], [0.0] * 4, [0.0] * 4], requires_grad=True)
    (grad,) = torch.autograd.grad(MATk(k=1, lam_update="gradient")(x).sum(), x)
    assert bool((grad >= 0).all()) and grad[0].tolist() == [0.25, 0.25, 0.0, 0.0]  # λ = 4: a shared λ's plain slope


def test_torch_func_over_a_trained_lambda_takes_the_formula():
    module = STk(k=0.5, lam_update="gradient", lam_init=1.0).eval()
    x = torch.rand(16)
    params = dict(module.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(module, p, (x,)))(params)
    leaf = module.lam
    (expected,) = torch.autograd.grad(module(x), leaf)
    torch.testing.assert_close(grads["lam"], expected)


def test_a_rules_settings_are_fixed_once_built():
    module = STk(k=0.5)
    with pytest.raises(AttributeError, match="^Adaptive's settings are fixed once built"):
        module.rule.lam_momentum = 0.5
    assert copy.deepcopy(module).rule.lam_momentum == module.lam_momentum == 0.1


def test_the_adaptive_rule_solves_short_rows_and_tracks_long_ones():
    """Where the default switches (results/bench/lambda_rules_cpu.md's grid straddles it) and how many
    solve steps a short row gets: about 512 losses of work, 1 to 8 steps."""
    stk, matk = STk(k=0.5), MATk(k=0.5)
    for module in (stk, matk):
        module(torch.rand(64).requires_grad_())  # started
    assert [stk.rule.uses_last(stk, n) for n in (2047, 2048)] == [False, True]
    assert [matk.rule.uses_last(matk, n) for n in (255, 256)] == [False, True]
    assert [stk.rule.steps_at(n) for n in (16, 64, 128, 256, 512, 1024)] == [8, 8, 4, 2, 1, 1]
    long = torch.rand(4096) + 5.0
    before = stk.lam_last.clone()
    value = stk(long.clone().requires_grad_())
    x = long.double() - before.double()  # a tracked call's value is Eq. 6 at the last call's λ
    expected = 0.5 * (x + torch.sqrt(x * x + 0.01**2) - 0.01).mean() + 0.5 * before.double()
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(stk.lam_last, before)  # and it steps λ for the next call
