"""λ in band under each λ rule of STk and MATk on i.i.d. batches: for every ``lam_update=`` rule (and
the library default), n, k and loss distribution, the share of training calls on which the module's
own monitor finds λ in band, into results/bench/lambda_rules_cpu.{json,md}.

    python scripts/lambda_rules_band.py                               # every rule, STk and MATk, 400 calls
    python scripts/lambda_rules_band.py --rules track solve gradient  # these rules (and the default)
    python scripts/lambda_rules_band.py --quick --out /tmp/lr         # a small grid, few calls (the test's)

Each cell (loss, rule, n, k, distribution) is one fresh module in training mode, called ``--calls``
times, each call on a fresh i.i.d. float32 batch with ``requires_grad=True`` from a torch.Generator
seeded by (``--seed``, n, k, distribution), so every rule and both losses see the same batches, and
``loss(x).backward()``. In band is ``module.monitor.pop_epoch()["lam_in_band_all"]`` after the calls
(:mod:`topklab.losses.aggregate.lambda_monitor`: the share of calls whose smoothed share above λ is
within a factor 2 of k/n and its complement within a factor 2 of 1 − k/n), every call counted, the
first too. A rule whose λ is a parameter (``"gradient"``) gets a plain SGD on λ at lr 0.1 (the
paper's update), stepped after every call; the other rules move λ themselves.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import torch  # noqa: E402

from topklab.losses import MATk, STk  # noqa: E402
from topklab.report.outputs import machine_label, script_command, write_outputs  # noqa: E402
from topklab.utils.k import resolve_k  # noqa: E402
from topklab.utils.provenance import git_info  # noqa: E402

FALLBACK_RULES = ("track", "solve", "gradient")  # lam_update's names before lambda_rules.RULES
NS = (16, 64, 128, 256, 1024, 2048, 4096)  # the last four around the adaptive rule's switches
KS = (0.1, 0.5, 0.9)
DISTRIBUTIONS = ("uniform", "lognormal")
DISTRIBUTION_LABELS = {"uniform": "U(0, 3)", "lognormal": "exp(N(0, 1))"}
QUICK = {"ns": (16, 4096), "ks": (0.1, 0.5), "calls": 40}
DELTA = 0.01  # STk's SReLU width (the paper's)
SGD_LR = 0.1  # the paper's update of a parameter λ
TARGET = 0.9  # the default rule should be in band on at least this share of calls in every cell
DEFAULT = "default"
LOSSES = {"stk": ("STk", STk), "matk": ("MATk", MATk)}
OUT_OF_BAND_WARNING = re.compile(r"MATk/STk: λ has been out of band")


def library_rules() -> tuple[list[str], str]:
    """The names in ``topklab.losses.aggregate.lambda_rules.RULES``, or :data:`FALLBACK_RULES` where
    that module does not exist yet; and where they came from."""
    try:
        from topklab.losses.aggregate.lambda_rules import RULES
    except ImportError:
        return list(FALLBACK_RULES), "fallback (topklab.losses.aggregate.lambda_rules not importable)"
    return list(RULES), "topklab.losses.aggregate.lambda_rules.RULES"


def rule_name(module) -> str:
    """The name of the rule a module runs: ``lam_update`` where it is a name, else the rule's ``name``
    (or its class's name)."""
    rule = getattr(module, "lam_update", None)
    if isinstance(rule, str):
        return rule
    return str(getattr(rule, "name", None) or type(rule).__name__)


def build(loss: str, k: float, rule: str):
    """A fresh module of ``loss`` at k; ``rule`` a ``lam_update=`` name or :data:`DEFAULT` (built
    without ``lam_update``)."""
    cls = LOSSES[loss][1]
    kwargs = {} if rule == DEFAULT else {"lam_update": rule}
    if cls is STk:
        kwargs["delta"] = DELTA
    return cls(k, **kwargs)


def batches(n: int, k: float, distribution: str, seed: int):
    """The cell's generator of i.i.d. float32 batches of n losses, seeded by (seed, n, k, distribution)."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{n}/{k}/{distribution}".encode()))

    def draw() -> torch.Tensor:
        if distribution == "uniform":
            x = torch.rand(n, generator=generator) * 3.0
        elif distribution == "lognormal":
            x = torch.randn(n, generator=generator).exp()
        else:
            raise ValueError(f"unknown distribution {distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")
        return x.requires_grad_(True)

    return draw


def measure(loss: str, rule: str, n: int, k: float, distribution: str, calls: int, seed: int) -> dict:
    """One cell: ``calls`` training calls of a fresh module, then its monitor's epoch."""
    try:
        module = build(loss, k, rule)
    except (ValueError, TypeError) as err:  # a rule this loss does not take
        return {"in_band_all": None, "error": str(err).splitlines()[0]}
    module.train()
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=SGD_LR) if parameters else None
    draw = batches(n, k, distribution, seed)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            module(draw()).backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    warned = False
    for w in caught:
        if OUT_OF_BAND_WARNING.search(str(w.message)):
            warned = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    epoch = module.monitor.pop_epoch()
    return {
        "rule_name": rule_name(module),
        "in_band_all": epoch["lam_in_band_all"],
        "in_band_all_hits": epoch["lam_in_band_all_hits"],
        "calls": epoch["lam_calls"],
        "smoothed_share": epoch["smoothed_share"],
        "hard_share": epoch["hard_share"],
        "lam_minus_kth": epoch["lam_minus_kth"],
        "sgd_on_lambda": optimizer is not None,
        "warned_out_of_band": warned,
        "seconds": seconds,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rules",
        nargs="+",
        default=None,
        help="lam_update names (default: every name in topklab.losses.aggregate.lambda_rules.RULES, or "
        f"{' '.join(FALLBACK_RULES)} where it does not exist); the library default is always added",
    )
    parser.add_argument("--losses", nargs="+", choices=tuple(LOSSES), default=list(LOSSES))
    parser.add_argument("--calls", type=int, default=None, help="training calls per cell (default 400; --quick 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="n 16, 4096; k 0.1, 0.5; 40 calls (for the test)")
    parser.add_argument("--out", default=str(ROOT / "results" / "bench"), help="the output folder")
    args = parser.parse_args(argv)
    if args.calls is not None and args.calls < 1:
        parser.error(f"--calls {args.calls}: give at least 1 call per cell")
    return args


def short_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def share(value) -> str:
    """A share as the table prints it: four decimals without trailing zeros (exact for calls dividing
    10,000, e.g. 400), "—" where the rule does not apply."""
    return "—" if value is None else (f"{value:.4f}".rstrip("0").rstrip(".") or "0")


def row_label(loss: str, rule: str, defaults: dict) -> str:
    return f"default ({defaults[loss]})" if rule == DEFAULT else rule


def default_minimum(cells: list[dict], loss: str | None = None) -> dict | None:
    """The default rule's cell of least in-band share (over ``loss``'s cells, or every loss's)."""
    scored = [c for c in cells if c["rule"] == DEFAULT and c["in_band_all"] is not None and loss in (None, c["loss"])]
    return min(scored, key=lambda c: c["in_band_all"]) if scored else None


def where(cell: dict) -> str:
    return f"n = {cell['n']}, k = {cell['k']}, {DISTRIBUTION_LABELS[cell['distribution']]}"


def default_line(cells: list[dict], loss: str | None, defaults: dict) -> str:
    worst = default_minimum(cells, loss)
    if worst is None:
        return "No cell of the library default has a defined band."
    name = f"{LOSSES[loss][0]}'s library default ({defaults[loss]})" if loss else "The library default"
    return (
        f"**{name}: minimum in-band share over all cells {share(worst['in_band_all'])}** ({where(worst)}); "
        f"≥ {TARGET}: {'yes' if worst['in_band_all'] >= TARGET else 'no'}."
    )


def render(cells: list[dict], settings: dict, meta: dict) -> str:
    ns, ks, dists, rules = settings["ns"], settings["ks"], settings["distributions"], settings["rules"]
    defaults = meta["defaults"]
    by_key = {(c["loss"], c["rule"], c["n"], c["k"], c["distribution"]): c for c in cells}
    sgd = sorted(
        {
            row_label(c["loss"], c["rule"], defaults) + f" ({LOSSES[c['loss']][0]})"
            for c in cells
            if c.get("sgd_on_lambda")
        }
    )
    clean = {True: "dirty tree: uncommitted changes outside results/", False: "clean tree", None: "tree state unknown"}
    lines = [
        "# λ in band under each λ rule of STk and MATk, i.i.d. batches",
        "",
        f"Produced by `{meta['command']}` at commit {meta['sha']} ({clean[meta['dirty']]}), torch {torch.__version__}, "
        f"{meta['date']}; {meta['machine']}. Measuring every cell below took {meta['elapsed_s']:.1f} s.",
        "",
        f"Each cell: a fresh module in training mode called {settings['calls']} times, each call on a fresh i.i.d. "
        f"batch of n float32 losses (`requires_grad=True`; U(0, 3) or exp(N(0, 1)), a torch.Generator seeded by "
        f"(seed {settings['seed']}, n, k, distribution): every rule and both losses see the same batches), then "
        f"`loss(x).backward()`. k is a fraction (the module rounds k·n to a count); STk's δ = {DELTA}. "
        "**In band** is the module's own monitor, `monitor.pop_epoch()['lam_in_band_all']` after the calls: the "
        "share of calls whose smoothed share above λ is within a factor 2 of k/n and its complement within a factor "
        "2 of 1 − k/n, every call counted (no warm-up excluded: the first call too). Nothing else is set on the "
        f"monitor or the module (the default row is the module built without `lam_update`). A rule whose λ is a "
        f"parameter gets a plain SGD on λ at lr {SGD_LR} (the paper's update), stepped after every call: "
        f"{', '.join(sgd) or 'none'}. Rules from {meta['rules_source']}.",
        "",
        "Shares are hits / calls, printed to 4 decimals (exact at 400 calls); — : the loss does not take the rule.",
    ]
    for loss in settings["losses"]:
        title = LOSSES[loss][0]
        lines += [
            "",
            f"## {title}: minimum over k ∈ {{{', '.join(map(str, ks))}}}",
            "",
            "| rule | distribution | " + " | ".join(f"n = {n}" for n in ns) + " |",
            "|---|---|" + "---|" * len(ns),
        ]
        for rule in rules:
            for dist in dists:
                row = []
                for n in ns:
                    values = [by_key[(loss, rule, n, k, dist)]["in_band_all"] for k in ks]
                    known = [v for v in values if v is not None]
                    row.append(share(min(known)) if known else "—")
                lines.append(
                    f"| {row_label(loss, rule, defaults)} | {DISTRIBUTION_LABELS[dist]} | " + " | ".join(row) + " |"
                )
        lines += [
            "",
            f"### {title}: every k",
            "",
            "| rule | distribution | " + " | ".join(f"n = {n}, k = {k}" for n in ns for k in ks) + " |",
            "|---|---|" + "---|" * (len(ns) * len(ks)),
        ]
        for rule in rules:
            for dist in dists:
                row = [share(by_key[(loss, rule, n, k, dist)]["in_band_all"]) for n in ns for k in ks]
                lines.append(
                    f"| {row_label(loss, rule, defaults)} | {DISTRIBUTION_LABELS[dist]} | " + " | ".join(row) + " |"
                )
        lines += ["", default_line(cells, loss, defaults)]
    lines += ["", default_line(cells, None, defaults)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    listed, source = library_rules()
    if args.rules is not None:
        listed, source = list(args.rules), "the command line (--rules)"
    rules = [DEFAULT] + [r for r in dict.fromkeys(listed) if r != DEFAULT]
    ns, ks = (QUICK["ns"], QUICK["ks"]) if args.quick else (NS, KS)
    calls = args.calls or (QUICK["calls"] if args.quick else 400)
    settings = {
        "losses": list(args.losses),
        "rules": rules,
        "ns": list(ns),
        "ks": list(ks),
        "distributions": list(DISTRIBUTIONS),
        "calls": calls,
        "seed": args.seed,
        "delta": DELTA,
        "sgd_lr": SGD_LR,
        "quick": args.quick,
        "device": "cpu",
    }
    defaults = {loss: rule_name(build(loss, 0.5, DEFAULT)) for loss in args.losses}
    # load (or build) the native kernel before the clock starts: it is not part of any cell
    build("stk", 0.5, DEFAULT)(torch.rand(8, requires_grad=True)).backward()

    cells = []
    started = time.perf_counter()
    for loss in args.losses:
        for rule in rules:
            for n in ns:
                for k in ks:
                    for dist in DISTRIBUTIONS:
                        cell = {"loss": loss, "rule": rule, "n": n, "k": k, "count": resolve_k(k, n)}
                        cell.update(distribution=dist, **measure(loss, rule, n, k, dist, calls, args.seed))
                        cells.append(cell)
            done = [c for c in cells if c["loss"] == loss and c["rule"] == rule and c["in_band_all"] is not None]
            low = min((c["in_band_all"] for c in done), default=None)
            print(
                f"{LOSSES[loss][0]} {row_label(loss, rule, defaults)}: min in band {share(low)} over {len(done)} cells",
                flush=True,
            )
    elapsed = time.perf_counter() - started

    command = script_command("lambda_rules_band.py", argv)
    git = git_info(ROOT)
    meta = {
        "command": command,
        "sha": short_sha() or "unknown",
        "dirty": git.get("dirty"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"cpu: {machine_label('cpu', torch.get_num_threads())}",
        "defaults": defaults,
        "rules_source": source,
        "elapsed_s": elapsed,
    }
    worst = {loss: default_minimum(cells, loss) for loss in args.losses}
    payload = {
        "cells": cells,
        "defaults": defaults,
        "rules_source": source,
        "default_minimum": {
            loss: None if w is None else {**w, "at_least_target": w["in_band_all"] >= TARGET}
            for loss, w in worst.items()
        },
        "target": TARGET,
        "elapsed_s": elapsed,
        "torch": torch.__version__,
        "sha_short": meta["sha"],
        "dirty": meta["dirty"],
        "date": meta["date"],
    }
    stem = "lambda_rules_cpu_quick" if args.quick else "lambda_rules_cpu"
    out = Path(args.out)
    text = render(cells, settings, meta)
    write_outputs(out, stem, payload, command, settings, markdown=text)
    print(default_line(cells, None, defaults).replace("**", ""))
    print(f"wrote {out / stem}.{{json,md}}")
    print(f"grid of {len(cells)} cells × {calls} calls: {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
