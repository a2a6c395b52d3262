"""``equishard report``: one self-contained HTML page that shows what balancing did.

Everything comes from the generation itself (its manifest, cost table and plan): distributions
of vision tokens, LLM tokens and images per sample (audio tokens, videos and recordings where
the data has them); per-step, per-rank loads of every phase (vision, audio, LLM) for
random batching of the same samples (before) and for the plan (after), as heatmaps of load over
the step's mean; dist ratio and efficiency step by step; group and shard sizes; and, for a
generation made by ``equishard rebalance``, what changed since its parent. Plots are PNGs
(matplotlib, Agg) embedded as data URIs: the page needs no network and no other file.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np

from equishard.contracts.columns import (
    AUDIO_TOKENS,
    LLM_TOKENS,
    NUM_AUDIOS,
    NUM_IMAGES,
    NUM_VIDEOS,
    VIDEO_TOKENS,
    VIT_TOKENS,
)
from equishard.contracts.generation_names import COST_FILE, PLAN_FILE
from equishard.contracts.phases import REPORTED
from equishard.contracts.shared_tower import fold_shared_towers
from shards.store.manifest import carried_bytes

__all__ = ["phases_of", "render_report", "step_loads"]

COLOURS = {"vision": "#4c72b0", "audio": "#55a868", "llm": "#dd8452"}
# (name, cost-table column, colour) of every phase a report can draw, in the order drawn
PHASES = tuple((p.name, p.tokens, COLOURS[p.name]) for p in REPORTED)


def phases_of(cost) -> list[tuple[str, str, str]]:
    """The phases a (folded) cost table has: vision and LLM always, audio with recordings."""
    return [p for p in PHASES if p[1] in cost.column_names]


def step_loads(plan, cost, d: int, steps: int | None = None) -> dict[str, np.ndarray]:
    """[steps, d] loads per phase for the plan ('after') and for random batching ('before');
    ``ValueError`` for a plan whose samples, steps (``steps``: how many) or ranks are not the
    cost table's and the layout's."""
    where = {s: i for i, s in enumerate(cost.column("sample_id").to_pylist())}
    missing = [s for s in plan.column("sample_id").to_pylist() if s not in where]
    if missing:
        raise ValueError(
            f"the plan holds {len(missing)} sample(s) the cost table lacks (first {missing[0]!r})"
        )
    rows = np.array([where[s] for s in plan.column("sample_id").to_pylist()], dtype=np.int64)
    x = {name: cost.column(col).to_numpy().astype(np.float64) for name, col, _ in phases_of(cost)}
    step = plan.column("step").to_numpy().astype(np.int64)
    rank = plan.column("rank").to_numpy().astype(np.int64)
    if steps is not None and ((step < 0) | (step >= steps)).any():
        raise ValueError(f"the plan has steps outside 0..{steps - 1}, the manifest's steps")
    if ((rank < 0) | (rank >= d)).any():
        raise ValueError(f"the plan has ranks outside 0..{d - 1}, the manifest's layout")
    n_steps = int(step.max()) + 1 if step.size else 0
    slot = step * d + rank
    out = {
        f"{name}_after": np.bincount(slot, x[name][rows], n_steps * d).reshape(n_steps, d)
        for name in x
    }
    # random batching as the usual sampler does it: a permutation, cut into equal batches
    n = cost.num_rows
    b = max(1, round(n / max(n_steps * d, 1)))
    perm = np.random.default_rng(1).permutation(n)
    batch = np.empty(n, dtype=np.int64)
    batch[perm] = np.arange(n) // b
    k = (int(batch.max()) + 1) // d if n else 0
    for name, loads in x.items():
        per = np.bincount(batch, weights=loads)
        out[f"{name}_before"] = per[: k * d].reshape(k, d) if k else per[None, :d]
    return out


def _png(fig, bar=None) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    if bar is not None:
        bar.update()
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _per_step(loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mx = loads.max(axis=1)
    mean = loads.mean(axis=1)
    d = loads.shape[1]
    gap = (mx[:, None] - loads).sum(axis=1)
    dist = np.divide(gap, mx * d, out=np.zeros_like(mx), where=mx > 0)  # a step of no load: 0
    eff = np.divide(mean, mx, out=np.ones_like(mx), where=mx > 0)
    return dist, eff


def _figures(m, plan, cost, bar=None) -> list[tuple[str, str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    raw, cost = cost, fold_shared_towers(cost)  # as balanced: video frames in the vision load
    phases = phases_of(cost)
    panels = [  # what each sample costs, videos apart from images (the table as prep wrote it)
        (col, f"{what} per sample", kind, color)
        for col, what, kind, color in (
            (VIT_TOKENS, "image tokens" if VIDEO_TOKENS in raw.column_names else "vision tokens",
             "hist", "#4c72b0"),
            (VIDEO_TOKENS, "video tokens", "hist", "#64b5cd"),
            (AUDIO_TOKENS, "audio tokens", "hist", "#55a868"),
            (LLM_TOKENS, "LLM tokens", "hist", "#dd8452"),
            (NUM_IMAGES, "images", "bar", "#8c8c8c"),
            (NUM_VIDEOS, "videos", "bar", "#8c8c8c"),
            (NUM_AUDIOS, "recordings", "bar", "#8c8c8c"),
        )
        if col in raw.column_names
    ]  # fmt: skip
    cols = 4 if len(panels) > 4 else len(panels)
    rows = -(-len(panels) // cols)
    fig, ax = plt.subplots(
        rows, cols, figsize=(13, 3.2 * rows), squeeze=False, layout="constrained"
    )
    for a, (col, title, kind, color) in zip(ax.ravel(), panels, strict=False):
        x = raw.column(col).to_numpy()
        if kind == "hist":
            a.hist(x, bins=40, color=color)
        else:
            a.bar(*np.unique(x, return_counts=True), color=color)
        a.set(title=title, ylabel="samples")
    for a in ax.ravel()[len(panels) :]:
        a.axis("off")
    figs.append(("Samples", "What each sample costs each encoder and the LLM.", _png(fig, bar)))

    try:
        loads = step_loads(plan, cost, m.dp, m.steps)
    except ValueError as exc:
        raise ValueError(f"{m.storage.where(PLAN_FILE)}: {exc}") from None
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        len(phases), 2, figsize=(13, 3.5 * len(phases)), sharey="row", constrained_layout=True
    )
    for row, phase in enumerate(name for name, _, _ in phases):
        for col, when in enumerate(("before", "after")):
            x = loads[f"{phase}_{when}"]
            mean = x.mean(axis=1, keepdims=True)  # a step with no load in the phase: even
            rel = np.divide(x, mean, out=np.ones_like(x), where=mean > 0)
            a = axes[row, col]
            img = a.imshow(
                rel.T, aspect="auto", cmap="coolwarm", vmin=0.0, vmax=2.0, interpolation="nearest"
            )
            a.set(
                title=f"{'LLM' if phase == 'llm' else phase} load / step mean, "
                f"{'random batching' if when == 'before' else 'equishard plan'}",
                xlabel="step",
                ylabel="rank",
            )
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            a.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(img, ax=axes[row, :].tolist(), shrink=0.8)
    figs.append(
        (
            "Per-step, per-rank load",
            "Each column is a global step, each row a DP rank; "
            "white is the step's mean, red a straggler, blue an idle rank. Before: random "
            "batches of the same samples; after: this generation's plan.",
            _png(fig, bar),
        )
    )

    fig, ax = plt.subplots(1, 2, figsize=(13, 3.2))
    for phase, _, color in phases:
        for when, style in (("before", ":"), ("after", "-")):
            dist, eff = _per_step(loads[f"{phase}_{when}"])
            label = f"{phase} {'random' if when == 'before' else 'plan'}"
            ax[0].plot(dist, style, color=color, label=label)
            ax[1].plot(eff, style, color=color, label=label)
    ax[0].set(title="dist ratio per step (0 = even)", xlabel="step")
    ax[1].set(title="efficiency per step (mean / max, 1 = even)", xlabel="step", ylim=(0, 1.05))
    ax[0].legend(fontsize=8)
    figs.append(("Balance over steps", "Dist ratio and efficiency of every step.", _png(fig, bar)))

    gid = plan.column("group_id").to_numpy()
    _, sizes = np.unique(gid, return_counts=True)
    shard_mib = [sh.bytes / 2**20 for st in m.streams for sh in st.shards]
    fig, ax = plt.subplots(1, 2, figsize=(13, 3.2))
    ax[0].bar(*np.unique(sizes, return_counts=True), color="#8172b3")
    ax[0].set(title="samples per group", xlabel="group size", ylabel="groups")
    ax[1].hist(shard_mib, bins=20, color="#937860")
    ax[1].set(title="shard sizes", xlabel="MiB", ylabel="shards")
    figs.append(("Groups and shards", "", _png(fig, bar)))
    return figs


def _table(rows: list[tuple[str, object]]) -> str:
    return (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        + "</table>"
    )


def render_report(generation: str | Path, output: str | Path, *, progress: bool = False) -> Path:
    """Write the HTML report of a generation (directory, or root with CURRENT) to ``output``;
    ``progress``: a bar over reading the tables, the four figures and writing the page."""
    import pyarrow.parquet as pq
    from tqdm import tqdm

    from equishard.contracts.cost_table import read_cost_table
    from shards.store.manifest import open_generation
    from shards.store.storage import is_url

    m = open_generation(generation)
    local = not is_url(m.path)
    if local and Path(output).resolve().is_relative_to(Path(m.path).resolve()):
        raise ValueError(  # a published generation never changes (its files are checksummed)
            f"{output} is inside the generation {m.path}: write the report elsewhere (e.g. next "
            "to it, in the generation root)"
        )
    files = m.storage  # local, or an object store (the two tables are small: read whole)
    if not files.exists(COST_FILE) or not files.exists(PLAN_FILE):
        raise ValueError(
            f"{m.path}: no cost.parquet/plan.parquet in the generation; rewrite it "
            "with this equishard's 'write' to carry them"
        )
    # checked against the manifest: an edited plan with a step of 10^12 sized the heatmaps
    cost = read_cost_table(io.BytesIO(carried_bytes(m, COST_FILE)))
    plan = pq.read_table(io.BytesIO(carried_bytes(m, PLAN_FILE)))
    bar = tqdm(total=6, desc="report", unit="step", disable=not progress, leave=False)
    bar.update()  # the tables read
    r = m.report
    bal, rnd = r["metrics"]["balanced"], r["metrics"]["random"]
    summary = _table(
        [
            ("generation", m.generation),
            ("parent", m.parent or "-"),
            ("layout", f"{m.nodes} node(s) x {m.gpus_per_node} ranks, {m.steps} steps"),
            (
                "samples / groups / shards",
                f"{m.totals['samples']:,} / {m.totals['groups']:,} / {m.totals['shards']:,}",
            ),
            ("bytes", f"{m.totals['bytes'] / 2**20:,.1f} MiB"),
        ]
    )
    only = r["metrics"].get("llm_only")  # the LLM-only ablation, for tables with audio
    metrics = "<table><tr><th>metric</th><th>random batching</th><th>equishard plan</th>"
    metrics += "<th>LLM-only plan</th></tr>" if only else "</tr>"
    for measure, suffix, what in (
        ("dist_ratio", "", "dist ratio"),
        ("efficiency", "", "efficiency"),
        ("efficiency", "_cost", "efficiency"),
    ):
        for key, label in (("vit", "vision"), ("audio", "audio"), ("llm", "LLM")):
            k = f"{measure}_{key}{suffix}"
            if k not in bal:
                continue
            name = f"{what}, {label}" + (" (modeled cost)" if suffix else "")
            metrics += f"<tr><td>{name}</td><td>{rnd.get(k, 0):.4f}</td><td>{bal[k]:.4f}</td>"
            metrics += f"<td>{only[k]:.4f}</td></tr>" if only else "</tr>"
    metrics += "</table>"
    change = ""
    nightly = m.raw.get("nightly")
    if nightly:
        c, p = nightly["counts"], nightly["plan"]
        change = "<h2>Since the parent generation</h2>" + _table(
            [
                (
                    "samples",
                    f"{c['carried_in']:,} carried + {c['new']:,} new - {c['deleted']:,} "
                    f"deleted = {c['out']:,}",
                ),
                (
                    "updated / resubmitted unchanged",
                    f"{c['updated']} / {c['unchanged_resubmitted']}",
                ),
                ("rejected new samples", c.get("rejected", 0)),
                ("steps kept as they were", p["kept_steps"]),
                (
                    "parent steps rebuilt",
                    f"{p['rebuilt_parent_steps']} ("
                    + ", ".join(f"{k}: {v}" for k, v in sorted(p["rebuilt_because"].items()))
                    + ")",
                ),
                ("steps built tonight", p["new_steps"]),
            ]
        )
    sections = "".join(
        f"<h2>{html.escape(title)}</h2><p>{html.escape(text)}</p><img alt='{html.escape(title)}' src='{src}'>"
        for title, text, src in _figures(m, plan, cost, bar)
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>equishard report: {html.escape(m.generation)}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 10px;
text-align:left}}img{{max-width:100%}}h1{{font-size:1.6em}}</style></head><body>
<h1>equishard balance report</h1>{summary}<h2>Balance</h2>{metrics}{change}{sections}
<script type="application/json" id="report-data">{
        html.escape(json.dumps({"generation": m.generation, "metrics": r["metrics"]}))
    }</script>
</body></html>"""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    bar.update()
    bar.close()
    return out
