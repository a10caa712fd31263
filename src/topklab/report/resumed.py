"""Which runs of a table were resumed, and how: their training segments (``summary.segments``, each
under its identity from its first step), marked § beside the run's value and named in a footnote."""

from __future__ import annotations

# runs resumed before a result recorded its segments, as their run records say: (experiment, seed, commit) → how
RESUMED_UNRECORDED = {
    ("multi30k/atk", 2, "89409505e3"): "restarted twice, resumed from its epoch-2 checkpoint (CHANGELOG.md, Record)",
    ("multi30k/stk_paper_update", 2, "89409505e3"): (
        "restarted twice, resumed from its epoch-2 checkpoint (CHANGELOG.md, Record)"
    ),
}


def segments(result: dict) -> list[dict]:
    """The training segments a result records (a resumed run has more than one): the payload's ``segments``
    or its summary's; none for a result stored before they were recorded."""
    return result["result"].get("segments") or result["result"]["summary"].get("segments") or []


def seed_of(result: dict):
    """The seed a result ran with (its config's, else its provenance's)."""
    return result.get("config", {}).get("seed", result.get("provenance", {}).get("seeds", {}).get("seed"))


def resumed(result: dict) -> str | None:
    """How a run was resumed: its segments (each from its first step, under its identity), or what its
    run records say for a run stored before segments were recorded (:data:`RESUMED_UNRECORDED`); None
    for a run trained in one go.

    Examples
    --------
    >>> segment = {"device": "cpu", "cpu_capability": "AVX512", "threads": 1}
    >>> run = {"config": {"seed": 0}, "experiment": "multi30k/stk", "provenance": {"git": {"sha": "abc"}},
    ...        "result": {"summary": {"segments": [{**segment, "from_step": 0}, {**segment, "from_step": 540}]}}}
    >>> resumed(run)
    'segments from steps 0, 540 under one identity (device cpu, cpu_capability AVX512, threads 1)'
    >>> resumed({"result": {"summary": {}}}) is None
    True
    """
    parts = segments(result)
    if len(parts) > 1:
        identities = [{k: v for k, v in part.items() if k not in ("from_step", "to_step")} for part in parts]
        steps = ", ".join(str(part["from_step"]) for part in parts)
        if all(identity == identities[0] for identity in identities):
            return f"segments from steps {steps} under one identity ({_identity(identities[0])})"
        return "segments " + "; ".join(
            f"from step {part['from_step']} ({_identity(identity)})" for part, identity in zip(parts, identities)
        )
    if parts:
        return None
    provenance = result.get("provenance", {})
    key = (result.get("experiment"), seed_of(result), provenance.get("git", {}).get("sha", "")[:10])
    if key not in RESUMED_UNRECORDED:
        return None
    capability = provenance.get("hardware", {}).get("torch_cpu_capability")
    return (
        f"{RESUMED_UNRECORDED[key]}; stored before a result recorded its segments: its provenance records CPU "
        f"capability {capability}, no earlier segment's"
    )


def _identity(identity: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in identity.items())


def resumed_footnote(present, rows, labels) -> list[str]:
    """The § footnote of a table: each resumed run of its ``present`` rows and how (:func:`resumed`)."""
    named = [
        f"{labels[row]} seed {seed_of(r)}: {how}"
        for row in present
        for r in sorted(rows[row], key=lambda r: (seed_of(r) is None, seed_of(r)))
        if (how := resumed(r))
    ]
    return ["", f"§ Resumed runs: {'; '.join(named)}."] if named else []
