"""numba kernels of the balancing stage, one module per algorithm: :mod:`.isf` (offline ISF
grouping), :mod:`.tables` (per-sample and per-group tables of a plan), :mod:`.heap` (the indexed
heap the runtime kernels share), :mod:`.partition` (runtime partition of one step over ranks),
:mod:`.refine` (move and swap refinement), :mod:`.auto` (``auto``'s second opinions on a small
step), :mod:`.step_refine` (a step's groups evened in every phase), :mod:`.sparse_steps` (a
phase cleared out of the steps that hold only a little of it), :mod:`.placement` (groups onto
nodes and ranks, node-wise assignment) and :mod:`.schedule` (the 1F1B timeline).

Each kernel has a plain-Python twin in ``balancing._reference`` and a test that both agree over
many seeds. Kernels take and return numpy arrays only; randomness is drawn by the caller, so a
kernel is a pure function of its inputs.
"""

from balancing._kernels.auto import _nb_lower_bound, _nb_second_opinion
from balancing._kernels.heap import (
    _ih_fix,
    _ih_heapify,
    _ih_init,
    _ih_less,
    _ih_swap,
)
from balancing._kernels.isf import (
    _close,
    _nb_apply_round,
    _nb_best_fit,
    _nb_isf_round,
    _reaches,
    _round_two,
)
from balancing._kernels.partition import (
    INSERTION_MAX,
    _descending,
    _nb_argsort_desc,
    _nb_karmarkar_karp,
    _nb_lpt,
    _nb_lpt_capped,
    _nb_lpt_quadratic,
    _nb_padded_attention,
    _nb_padded_batches,
    _order_desc,
)
from balancing._kernels.placement import (
    _nb_greedy_node_assign,
    _nb_local_first,
    _nb_place_on_nodes,
)
from balancing._kernels.refine import (
    _fix_bin,
    _insert_sorted,
    _nb_refine,
    _pair_step,
    _remove_at,
    _slot_sift,
    _slot_up,
    _tree_prefix_min,
    _tree_set,
    _walk_next,
)
from balancing._kernels.schedule import (
    _nb_1f1b_ops,
    _nb_1f1b_times,
    _nb_makespan,
    _nb_swap_descent,
)
from balancing._kernels.sparse_steps import (
    _nb_clear_sparse,
    _receiver,
    _recount,
    _shift,
    _sparse,
    _tables,
)
from balancing._kernels.step_refine import _improve, _nb_refine_step, _nb_refine_steps
from balancing._kernels.tables import (
    STAT_COUNT,
    STAT_MAX_T,
    STAT_MAX_V,
    STAT_SUM_T,
    STAT_SUM_TC,
    STAT_SUM_V,
    STAT_SUM_VC,
    _add_to_stats,
    _nb_block_stats,
    _nb_counting_argsort,
    _nb_group_max,
    _nb_group_stats,
    _nb_phase_costs,
    _nb_sample_costs,
    _nb_stats_pad_ratios,
)

__all__ = [
    "INSERTION_MAX",
    "STAT_COUNT",
    "STAT_MAX_T",
    "STAT_MAX_V",
    "STAT_SUM_T",
    "STAT_SUM_TC",
    "STAT_SUM_V",
    "STAT_SUM_VC",
    "_add_to_stats",
    "_close",
    "_descending",
    "_fix_bin",
    "_ih_fix",
    "_ih_heapify",
    "_ih_init",
    "_ih_less",
    "_ih_swap",
    "_improve",
    "_insert_sorted",
    "_nb_1f1b_ops",
    "_nb_1f1b_times",
    "_nb_apply_round",
    "_nb_argsort_desc",
    "_nb_best_fit",
    "_nb_block_stats",
    "_nb_clear_sparse",
    "_nb_counting_argsort",
    "_nb_greedy_node_assign",
    "_nb_group_max",
    "_nb_group_stats",
    "_nb_isf_round",
    "_nb_karmarkar_karp",
    "_nb_local_first",
    "_nb_lower_bound",
    "_nb_lpt",
    "_nb_lpt_capped",
    "_nb_lpt_quadratic",
    "_nb_makespan",
    "_nb_padded_attention",
    "_nb_padded_batches",
    "_nb_phase_costs",
    "_nb_place_on_nodes",
    "_nb_refine",
    "_nb_refine_step",
    "_nb_refine_steps",
    "_nb_sample_costs",
    "_nb_second_opinion",
    "_nb_stats_pad_ratios",
    "_nb_swap_descent",
    "_order_desc",
    "_pair_step",
    "_reaches",
    "_receiver",
    "_recount",
    "_remove_at",
    "_round_two",
    "_shift",
    "_slot_sift",
    "_slot_up",
    "_sparse",
    "_tables",
    "_tree_prefix_min",
    "_tree_set",
    "_walk_next",
]
