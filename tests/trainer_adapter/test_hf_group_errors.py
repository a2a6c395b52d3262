"""One rank's error in a balanced step reaches every rank (trainer_adapter.group_errors).

Before, a rank whose inputs a wrapper refused, or whose tower or decoder failed on what it
received, raised alone; the other ranks waited in the step's next collective until the rank's
process exited (gloo: "connection closed"; NCCL: its timeout, 10 minutes), their logs silent on
the cause. Here each fault is planted on ONE rank of 4 (gloo, tiny real architectures, the
parity tests' uneven layouts: rank 1 empty, rank 3 text only) through module hooks, as a bug or
an out-of-memory error in a user's job would arise. Every rank must raise ``StepRefused``
naming the faulty rank and its reason (the faulty rank's own error chained as the cause), and
the group must stay usable: the same step run again without the fault gives the loss of a
clean run."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_parity import _decoder, _step, build_model, make_batches

pytest.importorskip("transformers")


def _tower(model):
    inner = getattr(model, "model", model)
    for name in ("visual", "vision_tower", "vision_model"):
        if getattr(inner, name, None) is not None:
            return getattr(inner, name)
    raise AssertionError("no tower")


def _first_layer(module):
    """The first submodule with parameters of its own that the module's forward runs."""
    for m in module.modules():
        if m is not module and any(True for _ in m.parameters(recurse=False)):
            return m
    raise AssertionError("no layer")


def _own_calls(hook):
    """A pre-hook applied only to the module's own calls (not a joined round)."""

    def pre(module, args, kwargs):
        if getattr(module, "equishard_joining", False):
            return None
        return hook(args, kwargs)

    return pre


def _cut(name: str, index: int):
    """A pre-hook that drops the last row of the input ``name`` (a keyword, or positional
    argument ``index``): one image's entry missing (a collator bug on one rank)."""

    def hook(args, kwargs):
        if name in kwargs:
            return args, {**kwargs, name: kwargs[name][:-1]}
        return (*args[:index], args[index][:-1], *args[index + 1 :]), kwargs

    return _own_calls(hook)


def _grown(args, kwargs):
    """The tiles padded by 7 px (a rank whose images the processor padded otherwise)."""
    if "pixel_values" in kwargs:
        return args, {**kwargs, "pixel_values": F.pad(kwargs["pixel_values"], (0, 7, 0, 7))}
    return (F.pad(args[0], (0, 7, 0, 7)), *args[1:]), kwargs


def _fail(module, args, kwargs):
    raise RuntimeError("CUDA out of memory (planted on this rank)")


# fault: (rank, where: "tower" | "decoder" | the layers to fail, pre-hook, reason's words)
FAULTS = {
    # a per-image input the wrapper cannot move with the images (a user's extra kwarg)
    "tower-extra-input": (
        2,
        "tower",
        _own_calls(lambda a, k: (a, {**k, "image_scores": torch.ones(3)})),
        ["`image_scores`", "per-item data"],
    ),
    # patch rows that are not the ones the grids give (a collator bug on one rank)
    "tower-rows-short": (
        0,
        "tower",
        _own_calls(lambda a, k: ((a[0][:-1], *a[1:]), k)),
        ["patch rows", "grid_thw", "same images"],
    ),
    # each image's data beside pixel_values, one entry short
    "tower-sizes-short": (2, "tower", _cut("image_sizes", 1), ["image_sizes", "do not fit"]),
    "tower-masks-short": (2, "tower", _cut("patch_attention_mask", 1), ["patch masks for"]),
    "tower-shapes-short": (2, "tower", _cut("spatial_shapes", 2), ["spatial_shapes", "match"]),
    "tower-positions-short": (
        2,
        "tower",
        _cut("pixel_position_ids", 1),
        ["pixel_position_ids [n, P, 2]"],
    ),
    # tiles of another size on one rank, to a tower without patch masks to pad them with
    "tower-tiles-differ": (
        2,
        "tower",
        _own_calls(_grown),
        ["tiles of different sizes", "tiles of 28 x 28 px", "tiles of 35 x 35 px"],
    ),
    # the tower failing on the images this rank received (out of memory)
    "tower-fails": (0, "tower-layer", _fail, ["RuntimeError", "out of memory"]),
    # position ids that do not restart at 0 (HF's packed convention) on the text-only rank
    "decoder-positions": (
        3,
        "decoder",
        lambda m, a, k: (a, {**k, "position_ids": k["position_ids"] + 1}),
        ["first position is not 0"],
    ),
    # position ids one token short of the row
    "decoder-positions-short": (
        0,
        "decoder",
        lambda m, a, k: (a, {**k, "position_ids": k["position_ids"][..., :-1]}),
        ["do not cover the row"],
    ),
    # a per-token input the decoder wrapper does not know
    "decoder-extra-input": (
        0,
        "decoder",
        lambda m, a, k: (a, {**k, "token_scores": torch.ones(1, k["inputs_embeds"].shape[1])}),
        ["`token_scores`"],
    ),
    # a per-token input it moves, but not [1, L] beside the row
    "decoder-per-token-short": (
        2,
        "decoder",
        lambda m, a, k: (
            a,
            {
                **k,
                "moe_mm_token_type_ids": torch.zeros(
                    1, k["inputs_embeds"].shape[1] - 1, dtype=torch.long
                ),
            },
        ),
        ["moe_mm_token_type_ids", "[1, L, ...]"],
    ),
    # a setting the tower is called with (Granite Docling's fine connector path) differing
    # on one rank: moved tiles would run on another rank's path
    "tower-settings-differ": (
        2,
        "tower",
        _own_calls(lambda a, k: (a, {**k, "fine": True})),
        ["different settings", "{'fine': True}", "{'fine': False}"],
    ),
    # the same for the decoder (a plain keyword value one rank adds)
    "decoder-settings-differ": (
        0,
        "decoder",
        lambda m, a, k: (a, {**k, "window": 4}),
        ["different settings", "{'window': 4}"],
    ),
    # the decoder failing on the samples this rank received
    "decoder-fails": (2, "decoder-layer", _fail, ["RuntimeError", "out of memory"]),
}
REFUSALS = {"tower-fails": "RuntimeError", "decoder-fails": "RuntimeError"}
# settings that differ are no rank's own error: every rank that brought items is named (the
# ranks with images; with samples: all but the empty rank 1), none has a cause
SETTINGS = {
    "tower-settings-differ": [0, 2],
    "decoder-settings-differ": [0, 2, 3],
    "tower-tiles-differ": [0, 2],
}
_BOTH = ["tower-extra-input", "tower-fails"]
FAMILY_FAULTS = {
    # balance_vision and balance_decoder
    "qwen2vl": [f for f in FAULTS if f.startswith("decoder") or f in ("tower-rows-short", *_BOTH)],
    "internvl": [*_BOTH, "tower-tiles-differ"],  # balance_tiles
    "smolvlm": [*_BOTH, "tower-masks-short"],  # balance_tiles with patch masks
    "mistral3": [*_BOTH, "tower-sizes-short"],  # balance_pixtral
    "lfm2vl": [*_BOTH, "tower-shapes-short"],  # balance_naflex
    "gemma4": [*_BOTH, "tower-positions-short"],  # balance_patch_positions
    "granite_docling": ["tower-settings-differ"],  # balance_tiles with a batch-wide flag
}


def _plant(model, name):
    _, where, hook, _ = FAULTS[name]
    target = {"tower": _tower(model), "decoder": _decoder(model)}.get(where.split("-")[0])
    if where == "decoder-layer":  # its first layer (the embedding runs outside it)
        target = target.layers[0]
    elif where == "tower-layer":
        target = _first_layer(target)
    return target.register_forward_pre_hook(hook, with_kwargs=True)


def _run(family, fault, rank):
    """A balanced step of a fresh model; the fault planted on its rank. Returns the model,
    this rank's batch, its global target count and the error (or None)."""
    from trainer_adapter.group_errors import StepRefused
    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    model = build_model(family)
    batch = make_batches(family, model)[rank]
    balance_model(model, policy=RedistributePolicy(placement="identity"))
    n = global_targets(batch["labels"])
    handle = _plant(model, fault) if fault and rank == FAULTS[fault][0] else None
    error = None
    try:
        _step(model, batch, n)
    except StepRefused as e:
        cause = e.__cause__
        error = (str(e), sorted(e.reasons), type(cause).__name__ if cause else None)
    finally:
        if handle is not None:
            handle.remove()
    return model, batch, n, error


def rank_main(rank, world, family):
    import torch.distributed as dist

    def loss_of(model, batch, n):
        model.zero_grad(set_to_none=True)
        loss = _step(model, batch, n)
        dist.all_reduce(loss)
        return float(loss)

    out = {"clean": loss_of(*_run(family, None, rank)[:3])}
    for fault in FAMILY_FAULTS[family]:
        model, batch, n, error = _run(family, fault, rank)
        out[fault] = error
        out[fault + "/again"] = loss_of(model, batch, n)  # the group goes on
    return out


@functools.cache
def runs(family: str) -> list[dict]:
    return run_ranks(rank_main, 4, family, timeout=300)


CASES = [(f, fault) for f, faults in FAMILY_FAULTS.items() for fault in faults]


@pytest.mark.parametrize(("family", "fault"), CASES, ids=[f"{f}-{x}" for f, x in CASES])
def test_one_ranks_error_raised_on_every_rank(family, fault):
    faulty, _, _, words = FAULTS[fault]
    for rank, run in enumerate(runs(family)):
        assert run[fault] is not None, f"rank {rank} ran the step the fault was planted in"
        message, reasons, cause = run[fault]
        assert reasons == SETTINGS.get(fault, [faulty]), message
        assert f"rank {faulty} of 4" in message
        for word in words:
            assert word in message
        # the faulty rank's own error is the cause; the others raise with none
        want = REFUSALS.get(fault, "ValueError") if rank == faulty else None
        assert cause == (None if fault in SETTINGS else want), message
        # the group stays in step: the same step again, without the fault, as a clean run
        assert run[fault + "/again"] == pytest.approx(run["clean"], rel=1e-9)


def test_clean_step_raises_nothing():
    """Without a fault every rank gets the same loss (the control of the cases above)."""
    clean = [r["clean"] for r in runs("qwen2vl")]
    assert len(set(clean)) == 1
