"""The manifest's fields beside its streams, each checked for what its readers take from it:
the plan report (the loader reads its last step, a night rebuilds its balancing parameters from
it, ``report``/``inspect`` show its counts and metrics), the trainer's buffer sizes (``loads``),
the shard size and the record of the night that wrote it (a night re-runs or finishes from it).

Each check returns why a field is not what the writer writes (None: it is), and
:meth:`equishard.contracts.generation.GenerationManifest.from_json` raises that as a
``ManifestError`` naming the manifest."""

from __future__ import annotations

from equishard.common.values import is_count, is_number

__all__ = ["extras_problem", "report_problem"]

_BIG = 1 << 40


def _whole(v, hi: int = _BIG) -> bool:
    return is_count(v, 0, hi)


def report_problem(report) -> str | None:
    """Why the plan report is not a report as ``equishard balance`` writes it (its objects, the
    last step's fields, the counts the structure check compares)."""
    if not isinstance(report, dict):
        return f"field 'report' is {type(report).__name__}, expected object"
    for key in ("counts", "last_step", "parameters", "metrics"):
        if key in report and not isinstance(report[key], dict):
            return f"report.{key} is {type(report[key]).__name__}, expected object"
    last = report.get("last_step", {})
    if "short" in last and not isinstance(last["short"], bool):
        return f"report.last_step.short is {last['short']!r:.40}, expected true or false"
    if "empty_ranks" in last and not _whole(last["empty_ranks"]):
        return f"report.last_step.empty_ranks is {last['empty_ranks']!r:.40}, expected a count"
    counts = report.get("counts", {})
    for key in ("in", "out", "groups", "steps"):
        if key in counts and not _whole(counts[key]):
            return f"report.counts.{key} is {counts[key]!r:.40}, expected a count"
    for name, values in report.get("metrics", {}).items():  # shown by report and inspect
        if not isinstance(values, dict) or not all(map(is_number, values.values())):
            return f"report.metrics.{name} is not an object of numbers"
    return None


def extras_problem(raw: dict) -> str | None:
    """Why ``loads``, ``shard_size`` or ``nightly`` are not as the writer writes them."""
    loads = raw.get("loads")  # sizes the trainer's buffers: whole numbers in a sane range
    if loads is not None:
        if not isinstance(loads, dict):
            return f"field 'loads' is {type(loads).__name__}, expected object"
        for k, v in loads.items():
            if not _whole(v):
                return f"loads.{k} is {v!r:.40}; it must be a whole number of tokens >= 0"
    if "shard_size" in raw and not (
        _whole(raw["shard_size"], 1 << 63) and raw["shard_size"] >= 1024
    ):
        return f"shard_size is {raw['shard_size']!r:.40}, expected a whole number of bytes >= 1024"
    nightly = raw.get("nightly")
    if nightly is not None:
        if not isinstance(nightly, dict):
            return f"field 'nightly' is {type(nightly).__name__}, expected object"
        if "key" in nightly and not isinstance(nightly["key"], str):
            return "nightly.key is not a string"
        for key in ("counts", "plan"):
            if key in nightly and not isinstance(nightly[key], dict):
                return f"nightly.{key} is {type(nightly[key]).__name__}, expected object"
        counts, plan = nightly.get("counts", {}), nightly.get("plan", {})
        steps = {k: plan.get(k, 0) for k in ("kept_steps", "rebuilt_parent_steps", "new_steps")}
        if not all(map(_whole, [*counts.values(), *steps.values()])):
            return "nightly.counts and the plan's step counts must be counts (whole numbers >= 0)"
        why = plan.get("rebuilt_because", {})
        if not isinstance(why, dict) or not all(map(_whole, why.values())):
            return "nightly.plan.rebuilt_because must be an object of counts"
    return None
