"""Runtime balancing of audio towers inside real Hugging Face models (tiny configs, random
weights, no download): Qwen2.5-Omni's thinker (its audio tower of packed, chunked recordings
beside Qwen2.5-VL's vision tower: both balanced), Qwen2-Audio (padded 30-second-style
windows with their attention masks; an audio-only model), Voxtral (Whisper's padded windows
without a mask, four positions a token) and Audio Flamingo 3 (padded windows with each one's
frame mask). On 4 gloo ranks with uneven
batches, a rank with recordings and no image (it calls only the audio tower), a rank with an
image and no recording (only the vision tower), an empty rank: the loss and every parameter's
gradient with every phase balanced, without balancing, and from one process over the
concatenated global batch agree; recordings, images and samples really move. The same under
FSDP2 sharded per block (:mod:`tests.trainer_adapter.test_hf_fsdp`), also with one recording
and two samples over 4 ranks, where idle ranks run copies."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks
from tests.sweeps import sweep

transformers = pytest.importorskip("transformers")

from tests.trainer_adapter.test_hf_parity import (  # noqa: E402
    IMG,
    TEXT,
    VEND,
    VSTART,
    _grads,
    build_model,
)

AUDIO, ASTART, AEND = 993, 994, 995
MEL = 16
WINDOW = 32  # Qwen2-Audio's padded window here: max_source_positions 16 x the stem's stride 2
# per rank: samples as (text before, image grid or None, recording frames or None, text after)
OMNI_LAYOUT = [
    [(5, (1, 8, 12), 37, 7), (3, None, 50, 4), (2, (1, 6, 8), None, 2)],
    [],
    [(4, (1, 4, 4), None, 6), (9, None, None, 0)],  # an image, no recording
    [(2, None, 70, 3), (30, None, None, 0), (25, None, 16, 3)],  # recordings, no image
]
# Qwen2-Audio: frames of each recording (at most its window)
AUDIO_LAYOUT = [
    [(5, None, 32, 7), (3, None, 9, 4), (2, None, 20, 2), (6, None, 31, 1)],
    [],
    [(4, None, 17, 6)],
    [(30, None, None, 0), (25, None, 12, 3)],
]
NO_AUDIO = [
    [(5, (1, 8, 12), None, 7), (3, (1, 8, 8), None, 4)],
    [],
    [(4, None, None, 6)],
    [(9, None, None, 2)],
]
# Voxtral: Whisper's padded windows, no mask; every window 4 consecutive positions a token
# Audio Flamingo 3: Whisper's padded windows with each window's frame mask
# (input_features_mask), outputs cut to the recording's tokens after the tower
LAYOUTS = {
    "qwen25omni": OMNI_LAYOUT,
    "qwen2audio": AUDIO_LAYOUT,
    "voxtral": AUDIO_LAYOUT,
    "audioflamingo3": AUDIO_LAYOUT,
}
PADDED = ("qwen2audio", "voxtral", "audioflamingo3")
# one launch serves a family's tests: make test launches an unpadded and a padded encoder
# (Qwen2-Audio's runs end to end in make test: test_hf_qwen2audio_inputs.py)
SWEPT = sweep("every audio phase balanced", LAYOUTS, fast=("qwen25omni", "audioflamingo3"))
# one recording and two samples over 4 ranks: ranks 2 and 3 hold nothing (FSDP2: copies)
SPARSE = {
    "qwen25omni": [[(5, (1, 8, 12), 37, 7)], [(3, None, None, 2)], [], []],
    "qwen2audio": [[(5, None, 32, 7)], [(3, None, None, 2)], [], []],
    "voxtral": [[(5, None, 32, 7)], [(3, None, None, 2)], [], []],
    "audioflamingo3": [[(5, None, 20, 7)], [(3, None, None, 2)], [], []],
}


def audio_tokens(frames: int) -> int:
    """The processors' formula (stem stride 2, pooling stride 2), written out."""
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


def build(family: str):
    if family == "qwen25omni":
        return build_model("qwen25omni")
    if family == "audioflamingo3":
        cfg = transformers.AudioFlamingo3Config(
            audio_config=dict(
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=32,
                num_mel_bins=MEL,
                max_source_positions=WINDOW // 2,
            ),
            text_config={**TEXT, "model_type": "qwen2"},
            audio_token_id=AUDIO,
        )
        torch.manual_seed(0)
        return transformers.AudioFlamingo3ForConditionalGeneration(cfg).double()
    if family == "voxtral":
        cfg = transformers.VoxtralConfig(
            audio_config=dict(
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_mel_bins=MEL,
                max_source_positions=WINDOW // 2,
            ),
            text_config={**TEXT, "model_type": "llama", "head_dim": 8},
            audio_token_id=AUDIO,
        )
        torch.manual_seed(0)
        return transformers.VoxtralForConditionalGeneration(cfg).double()
    cfg = transformers.Qwen2AudioConfig(
        audio_config=dict(
            d_model=16,
            encoder_layers=2,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            num_mel_bins=MEL,
            max_source_positions=WINDOW // 2,
        ),
        text_config={**TEXT, "model_type": "qwen2"},
        audio_token_index=AUDIO,
    )
    torch.manual_seed(0)
    return transformers.Qwen2AudioForConditionalGeneration(cfg).double()


def make_batches(family: str, model, layout) -> list[dict]:
    rng = np.random.default_rng(3)
    out = []
    for samples in layout:
        ids, pos, pix, grids, feats = [], [], [], [], []
        for before, image, frames, after in samples:
            seq = list(rng.integers(3, 900, before))
            if image is not None:
                seq += [VSTART] + [IMG] * (int(np.prod(image)) // 4) + [VEND]
                rows = rng.normal(size=(int(np.prod(image)), 1176))
                pix.append(torch.from_numpy(rows))
                grids.append(image)
            if frames is not None:
                n = WINDOW // 2 // 4 if family == "voxtral" else audio_tokens(frames)
                tokens = [AUDIO] * n
                seq += [ASTART, *tokens, AEND] if family == "qwen25omni" else tokens
                feats.append(torch.from_numpy(rng.normal(size=(MEL, frames))))
            seq += list(rng.integers(3, 900, after))
            t = torch.tensor(seq)[None]
            if family == "qwen25omni":
                lens = torch.tensor([frames]) if frames is not None else None
                g = torch.tensor([image]) if image is not None else None
                rope, _ = model.model.get_rope_index(
                    t, image_grid_thw=g, attention_mask=torch.ones_like(t), audio_seqlens=lens
                )
                pos.append(torch.cat([torch.arange(t.shape[1])[None, None], rope], dim=0))
            else:
                pos.append(torch.arange(t.shape[1])[None])
            ids.append(t)
        qwen = family == "qwen25omni"
        empty_pos = torch.zeros(4, 1, 0) if qwen else torch.zeros(1, 0)
        input_ids = torch.cat(ids, 1) if ids else torch.zeros(1, 0, dtype=torch.long)
        labels = input_ids.clone()
        labels[(labels == IMG) | (labels == AUDIO)] = -100
        if ids:  # a sample's first token is never a target
            starts = np.cumsum([0] + [x.shape[1] for x in ids[:-1]])
            labels[0, starts] = -100
        batch = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": torch.cat(pos, -1) if pos else empty_pos.long(),
        }
        if qwen:
            batch["pixel_values"] = torch.cat(pix).double() if pix else None
            batch["image_grid_thw"] = torch.tensor(grids) if grids else None
        if feats:
            batch.update(_features(feats, WINDOW if family in PADDED else None))
            if family == "voxtral":  # it takes no feature mask: every window is whole
                del batch["feature_attention_mask"]
            if family == "audioflamingo3":  # its name for the frame mask
                batch["input_features_mask"] = batch.pop("feature_attention_mask")
        out.append(batch)
    return out


def _features(feats: list[torch.Tensor], window: int | None) -> dict:
    """The processor's layout: ``[recordings, mel, frames]`` padded (to ``window``, else to
    the longest), with the mask of each recording's frames."""
    width = window or max(f.shape[1] for f in feats)
    x = torch.zeros(len(feats), MEL, width, dtype=torch.float64)
    mask = torch.zeros(len(feats), width, dtype=torch.long)
    for i, f in enumerate(feats):
        x[i, :, : f.shape[1]] = f
        mask[i, : f.shape[1]] = 1
    return {"input_features": x, "feature_attention_mask": mask}


def _step(model, batch, num_items):
    """Forward and backward, the loss summed over target tokens and divided by the global
    number of them. Qwen2-Audio's own loss is each row's mean (it takes no
    ``num_items_in_batch``), so the loop computes it from the logits, as a user normalizing
    over the global batch does."""
    batch = dict(batch)
    labels = batch.pop("labels")
    logits = model(**batch, use_cache=False).logits  # packed: no KV cache
    loss = torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), labels[0, 1:], ignore_index=-100, reduction="sum"
    )
    loss = loss / num_items
    loss.backward()
    return loss.detach()


def shard_blocks(model) -> None:
    """``fully_shard`` on each block HF names in ``_no_split_modules``, innermost first (these
    models name a whole encoder beside its layers: Qwen2.5-Omni's audio and vision encoders),
    then on the model; unused parameters reduce-scattered too (FSDP2's find_unused)."""
    from torch.distributed.fsdp import fully_shard

    names = set(model._no_split_modules or ())
    for block in reversed([m for m in model.modules() if type(m).__name__ in names]):
        fully_shard(block)
    fully_shard(model)
    model.set_reduce_scatter_unused_params(True)


def rank_main(rank, world, family, mode, layout, fsdp=False):
    """One step on this rank; ``fsdp``: sharded per block by FSDP2 after balancing is
    installed (gradients are then the group's mean: times ``world``)."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    model = build(family)
    batch = make_batches(family, model, layout)[rank]
    policy = RedistributePolicy(enabled=mode == "balanced", placement="identity")
    balance_model(model, policy=policy)
    if fsdp:
        shard_blocks(model)
    loss = _step(model, batch, global_targets(batch["labels"]))
    dist.all_reduce(loss)
    params = dict(model.named_parameters())
    names = sorted(params)
    if fsdp:  # DTensors: each rank holds a shard
        full = [
            p.grad.full_tensor() * world if p.grad is not None else None
            for _, p in sorted(params.items())
        ]
        grads = {k: g for k, g in zip(names, full, strict=True) if g is not None}
    else:
        grads = _grads(model)
    flat = torch.cat(
        [
            grads.get(k, torch.zeros(params[k].shape, dtype=params[k].dtype)).reshape(-1)
            for k in names
        ]
    )
    if not fsdp:
        dist.all_reduce(flat)
    inner = model.model
    visual = getattr(inner, "visual", None)
    llm = getattr(inner.language_model, "last_route", None)  # none where it runs plain
    return {
        "loss": float(loss),
        "grads": flat.numpy(),
        "names": names,
        "audio_moved": inner.audio_tower.last_route.moved,
        "audio_copies": int(inner.audio_tower.last_route.copy_of.size),
        "vision_moved": visual.last_route.moved if visual is not None else None,
        "llm_moved": llm.moved if llm is not None else 0,
    }


def reference(family: str, layout):
    """One process, one packed row holding every rank's samples in rank order."""
    model = build(family)
    batches = make_batches(family, model, layout)
    flat = [s for rank in layout for s in rank]
    batch = make_batches(family, model, [flat])[0]
    n = int((batch["labels"][..., 1:] != -100).sum())
    loss = _step(model, batch, n)
    grads = _grads(model)
    params = dict(model.named_parameters())
    names = sorted(params)
    cat = torch.cat([grads.get(k, torch.zeros_like(params[k])).reshape(-1) for k in names])
    assert sum(b["input_ids"].shape[1] for b in batches) == batch["input_ids"].shape[1]
    return float(loss), cat.numpy(), names


def rank_scenarios(rank, world, family):
    out = {
        "balanced": rank_main(rank, world, family, "balanced", LAYOUTS[family]),
        "plain": rank_main(rank, world, family, "plain", LAYOUTS[family]),
    }
    if family == "qwen25omni":  # no recording anywhere: nobody calls the audio tower
        out["no_audio"] = rank_main(rank, world, family, "balanced", NO_AUDIO)
    out["fsdp"] = rank_main(rank, world, family, "balanced", LAYOUTS[family], fsdp=True)
    sparse = SPARSE[family]
    out["fsdp_sparse"] = rank_main(rank, world, family, "balanced", sparse, fsdp=True)
    out["fsdp_sparse_plain"] = rank_main(rank, world, family, "plain", sparse, fsdp=True)
    return out


@functools.cache
def scenarios(family: str) -> dict[str, list]:
    runs = run_ranks(rank_scenarios, 4, family, timeout=300)
    return {k: [r[k] for r in runs] for k in runs[0]}


def _equal_to_reference(runs, family, layout):
    ref_loss, ref_grads, names = reference(family, layout)
    for r in runs:
        assert r["names"] == names
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-6)
        np.testing.assert_allclose(r["grads"], ref_grads, rtol=1e-5, atol=1e-9)
    return dict(zip(names, np.split(ref_grads, np.cumsum(_sizes(family))[:-1]), strict=True))


def _sizes(family: str) -> list[int]:
    model = build(family)
    return [p.numel() for _, p in sorted(model.named_parameters())]


@pytest.mark.parametrize("family", SWEPT)
def test_every_phase_balanced_equals_unbalanced_equals_single_process(family):
    balanced, plain = scenarios(family)["balanced"], scenarios(family)["plain"]
    per_param = _equal_to_reference(balanced + plain, family, LAYOUTS[family])
    # the audio tower took part: its gradients are there, and recordings moved
    assert np.abs(per_param["model.audio_tower.layers.0.fc1.weight"]).sum() > 0
    assert balanced[0]["audio_moved"] > 0 and balanced[0]["llm_moved"] > 0
    assert plain[0]["audio_moved"] == plain[0]["llm_moved"] == 0
    if family == "qwen25omni":
        assert balanced[0]["vision_moved"] > 0 and plain[0]["vision_moved"] == 0


def test_a_step_without_any_recording():
    """No rank has a recording (the thinker never calls its audio tower): every rank still
    settles the audio rounds with the vision tower's, nobody hangs, and the step equals one
    process's."""
    runs = scenarios("qwen25omni")["no_audio"]
    _equal_to_reference(runs, "qwen25omni", NO_AUDIO)
    assert runs[0]["audio_moved"] == 0 and runs[0]["vision_moved"] > 0


@pytest.mark.parametrize("family", SWEPT)
def test_every_phase_balanced_under_fsdp2_per_block(family):
    runs = scenarios(family)["fsdp"]
    _equal_to_reference(runs, family, LAYOUTS[family])
    assert runs[0]["audio_moved"] > 0


@pytest.mark.parametrize("family", SWEPT)
def test_idle_ranks_run_copies_of_a_recording_under_fsdp2(family):
    """One recording over 4 ranks sharded per block: the ranks the plan gives none run a copy
    of it (its results dropped) so that every rank joins the audio tower's all-gathers, balanced
    and not; the step equals one process's."""
    runs = scenarios(family)
    for kind in ("fsdp_sparse", "fsdp_sparse_plain"):
        _equal_to_reference(runs[kind], family, SPARSE[family])
        assert runs[kind][0]["audio_copies"] > 0
