"""A plan's ``report.json``: its counts, the short last step, the parameters it was balanced with
(from which a night balances its new samples the same way) and its quality against random
batching (:mod:`balancing.plan_quality`). One builder for a plan made on one machine
(:func:`~balancing.plan.build_plan`) and one made over partitions
(:mod:`balancing.partitioned`)."""

from __future__ import annotations

import numpy as np

from balancing.isf import FLAG_NAMES, ISFParams

__all__ = ["CAP_NAME", "plan_report"]

CAP_NAME = {"audio": "a"}  # an encoder phase's letter in the caps' names (q_a, qf_a)


def plan_report(
    *,
    cfg,
    params: ISFParams,
    others: tuple,
    topology: tuple[int, int],
    n_in: int,
    n_out: int,
    gsize: np.ndarray,
    flags: np.ndarray,
    n_steps: int,
    last: np.ndarray,
    oversize: tuple[int, list],
    leftover_samples: int,
    refine: bool,
    kept_per_round: list,
    quality: dict,
    timings: dict,
    engine: dict | None = None,
) -> dict:
    """The report of a plan of ``n_out`` rows from ``n_in`` samples balanced with ``cfg``
    (a ``BalanceConfig``) and ISF ``params``: ``gsize``/``flags`` of every group (empty ones
    are dissolved groups or empty ranks of the last step), ``last`` the last step's groups,
    ``oversize`` (samples, the first ids), ``quality`` from ``plan_quality``; ``engine``: how
    it was run, where not on one machine."""
    nodes, per = topology
    nonempty = gsize > 0  # dissolved groups and empty last-step slots hold no samples
    flag_counts = np.bincount(flags[nonempty], minlength=len(FLAG_NAMES))
    n_groups = int(nonempty.sum())
    report = {
        "counts": {
            "in": n_in,
            "out": n_out,
            "groups": n_groups,
            "steps": int(n_steps),
            "groups_by_flag": {
                name: int(c) for name, c in zip(FLAG_NAMES, flag_counts, strict=True)
            },
            "oversize_samples": oversize[0],
            "oversize_sample_ids": oversize[1],
            "leftover_samples": leftover_samples,
            "avg_group_size": round(n_in / max(n_groups, 1), 4),
        },
        "last_step": {
            "short": bool(last.size),
            "how": (
                "the groups left after full steps were dissolved and their samples LPT-packed into "
                "one group per rank; no sample repeats"
                if last.size
                else "group count is a multiple of DP"
            ),
            "samples": int(gsize[last].sum()) if last.size else 0,
            "empty_ranks": int((gsize[last] == 0).sum()) if last.size else 0,
        },
        "parameters": {
            "dp": nodes * per,
            "nodes": nodes,
            "gpus_per_node": per,
            "target_batch": cfg.target_batch,
            "seed": cfg.seed,
            "refine_steps": cfg.refine_steps,
            "steps_refined": bool(refine),
            "isf": {
                "q_v": params.q_v,
                "q_t": params.q_t,
                "qf_v": params.qf_v,
                "qf_t": params.qf_t,
                **{f"q_{CAP_NAME[p.name]}": q for p, q in zip(others, params.q_e, strict=True)},
                **{f"qf_{CAP_NAME[p.name]}": q for p, q in zip(others, params.qf_e, strict=True)},
                "rounds": params.rounds,
                "slack": cfg.slack,
                "auto": cfg.q_v is None,
                "kept_per_round": kept_per_round,
            },
            "cost_model": cfg.cost_model.describe(),
            **({"engine": engine} if engine is not None else {}),
        },
        **quality,
        "seconds": {k: round(x, 4) for k, x in timings.items()},
    }
    return report
