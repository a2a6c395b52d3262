"""What the HF balancing wrappers refuse, on real architectures (tiny configs, random weights):
inputs they cannot move with the items, which would make a receiving rank run another rank's
images or samples with its own data. Every rank gets the same clear error at the same point
(no rank left hanging in a collective).

- Mllama: the tower takes each image's aspect ratios beside it, the decoder the images'
  cross-attention states per sample;
- Qwen3.5: linear-attention layers carry state across a packed row's samples unless given
  HF's packing kwargs;
- LFM2-VL: its decoder's short convolutions ignore HF's packing kwargs, so they are refused
  even with them (Qwen3.5's linear attention takes them);
- PaliGemma's prefix mask: one bidirectional block over every ``token_type_ids == 0`` token of
  the row, so packed samples see each other's images and prompts (its tower still balances);
- packing kwargs or positions that do not describe the row.
(Mistral 3's Pixtral tower, with each image's size beside it, was refused here too until it
got a wrapper of its own: see test_hf_parity.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_parity import TEXT, _tile_tower, lfm2vl_config, qwen35_config

pytest.importorskip("transformers")

IMG = 999


def _mllama(rank: int):
    import transformers as tf

    cfg = tf.MllamaConfig(
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_global_layers=1,
            attention_heads=2,
            image_size=28,
            patch_size=14,
            max_num_tiles=2,
            vision_output_dim=32,
            intermediate_layers_indices=[0],
            supported_aspect_ratios=[[1, 1], [1, 2]],
        ),
        text_config={**TEXT, "cross_attention_layers": [1], "rope_scaling": None},
        image_token_index=IMG,
    )
    torch.manual_seed(0)
    model = tf.MllamaForConditionalGeneration(cfg).double()
    ids = torch.tensor([[IMG, 5, 6, 7, 8, 3, 4, 5]])
    batch = {
        "input_ids": ids,
        "pixel_values": torch.randn(1, 1, 2, 3, 28, 28, dtype=torch.float64),
        "aspect_ratio_ids": torch.tensor([[2]]),
        "aspect_ratio_mask": torch.ones(1, 1, 2, dtype=torch.long),
        "cross_attention_mask": torch.ones(1, 8, 1, 2, dtype=torch.long),
        "position_ids": torch.cat([torch.arange(5), torch.arange(3)])[None],
    }
    return model, batch


def _qwen35(rank: int):
    import transformers as tf

    cfg = qwen35_config(["linear_attention", "full_attention"])
    model = tf.Qwen3_5ForConditionalGeneration(cfg).double()
    ids = torch.randint(3, 900, (1, 12))
    return model, {
        "input_ids": ids,
        "position_ids": torch.cat([torch.arange(5)] * 2 + [torch.arange(2)])[None],
    }


def _lfm2vl(rank: int):
    """LFM2-VL: a decoder of short-convolution and attention layers; two packed samples."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = lfm2vl_config(["conv", "full_attention"])
    model = tf.Lfm2VlForConditionalGeneration(cfg).double()
    return model, {
        "input_ids": torch.randint(3, 900, (1, 11)),
        "position_ids": torch.cat([torch.arange(6), torch.arange(5)])[None],
    }


def _paligemma(rank: int):
    """PaliGemma: rank 0 packs three samples (image, prompt | answer), rank 1 holds one."""
    import transformers as tf

    cfg = tf.PaliGemmaConfig(
        vision_config=_tile_tower("siglip_vision_model"),
        text_config={**TEXT, "model_type": "gemma", "head_dim": 8},
        image_token_index=IMG,
        projection_dim=32,
    )
    torch.manual_seed(0)
    model = tf.PaliGemmaForConditionalGeneration(cfg).double()
    gen = torch.Generator().manual_seed(rank)
    ids, types, pos = [], [], []
    for prompt, answer in [(3, 4), (2, 5), (1, 2)][
        : 3 if rank == 0 else 1
    ]:  # 16 image tokens, prompt | answer
        ids.append(torch.cat([torch.full((16,), IMG), torch.randint(3, 900, (prompt + answer,))]))
        types.append(torch.tensor([0] * (16 + prompt) + [1] * answer))
        pos.append(torch.arange(16 + prompt + answer))
    return model, {
        "input_ids": torch.cat(ids)[None],
        "token_type_ids": torch.cat(types)[None],
        "position_ids": torch.cat(pos)[None],
        "pixel_values": torch.randn(len(ids), 3, 28, 28, dtype=torch.float64, generator=gen),
    }


MODELS = {"mllama": _mllama, "qwen35": _qwen35, "paligemma": _paligemma, "lfm2vl": _lfm2vl}


def rank_main(rank, world, name, encoder, llm, enabled, change):
    """One step of model ``name`` on this rank with ``balance_model(encoder=, llm=)`` and the
    policy ``enabled`` or not; the error message if it refused, else the loss and gradients
    summed over ranks and the samples the decoder moved. ``change`` alters the row first."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model
    from trainer_adapter.redistribute import RedistributePolicy

    model, batch = MODELS[name](rank)
    batch = CHANGES[change](batch)
    policy = RedistributePolicy(enabled=enabled, placement="identity")
    balance_model(model, encoder=encoder, llm=llm, policy=policy)
    try:
        out = model(**batch, labels=batch["input_ids"], use_cache=False)
    except ValueError as e:
        return str(e)
    out.loss.backward()
    loss = out.loss.detach().reshape(1)
    dist.all_reduce(loss)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    dist.all_reduce(grads)
    route = getattr(model.model.language_model, "last_route", None)
    tower = getattr(model.model, "vision_tower", None)
    images = tower.last_route.moved if hasattr(tower, "last_route") else 0
    return float(loss), grads.numpy(), route.moved if route else 0, images


def _wrong_boundaries(batch):
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)  # the row's samples are 5 + 5 + 2 long
    return {**batch, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 8}


def _packing_kwargs(batch):  # what DataCollatorWithFlattening gives for the row
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
    seq_idx = (batch["position_ids"] == 0).cumsum(-1).to(torch.int32) - 1
    packing = {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k, "seq_idx": seq_idx}
    return {**batch, **packing, "max_length_q": int(max_q), "max_length_k": int(max_k)}


def _three_row_positions(batch):  # Qwen's mrope positions without the text row
    return {**batch, "position_ids": batch["position_ids"].expand(3, 1, -1)}


def _padded_batch(batch):  # the row's samples as a processor call pads them: [n, longest]
    ids, pos = batch["input_ids"][0], batch["position_ids"][0]
    samples = torch.tensor_split(ids, torch.nonzero(pos == 0).flatten()[1:].tolist())
    longest = max(len(s) for s in samples)
    padded = torch.zeros(len(samples), longest, dtype=ids.dtype)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for i, s in enumerate(samples):
        padded[i, : len(s)], mask[i, : len(s)] = s, 1
    return {"input_ids": padded, "attention_mask": mask}  # positions left to the model


def _padded_row(batch):  # one row, 3 padding tokens at its end
    ids, pos = batch["input_ids"], batch["position_ids"]
    mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 3, dtype=ids.dtype)], 1)
    tail = pos[:, -1:] + torch.arange(1, 4)
    ids = torch.cat([ids, torch.zeros(1, 3, dtype=ids.dtype)], 1)
    return {
        **batch,
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.cat([pos, tail], 1),
    }


CHANGES = {
    "none": lambda b: b,
    "padded_batch": _padded_batch,
    "padded_row": _padded_row,
    "wrong_boundaries": _wrong_boundaries,
    "three_rows": _three_row_positions,
    "packing": _packing_kwargs,
}


REFUSED = {  # case: (model, encoder, llm, change, words the error must hold)
    "mllama-cross-attention": (
        "mllama",
        False,
        True,
        "none",
        ["MllamaTextModel", "`cross_attention_states`"],
    ),
    "mllama-aspect-ratios": (
        "mllama",
        True,
        False,
        "none",
        ["MllamaVisionModel", "`aspect_ratio_ids`"],
    ),
    "qwen35-no-packing-kwargs": (
        "qwen35",
        False,
        True,
        "none",
        ["linear_attention", "cu_seq_lens_q"],
    ),
    "paligemma-prefix-across-samples": (  # rank 1's single sample crosses nothing: it is
        "paligemma",  # refused all the same, not left waiting in the exchange
        False,
        True,
        "none",
        ["GemmaModel", "attention_mask", "attend to each other", "llm=False"],
    ),
    "lfm2vl-conv-ignores-packing-kwargs": (
        "lfm2vl",
        False,
        True,
        "packing",
        ["Lfm2Model (lfm2)", "conv layers", "llm=False", "qwen3_5_text"],
    ),
    "qwen35-wrong-boundaries": (
        "qwen35",
        False,
        True,
        "wrong_boundaries",
        ["cu_seq_lens_q", "[0, 4, 12]", "[0, 5, 10"],
    ),
    "qwen35-padded-batch": (  # a padded batch, as most loops feed one: pack it first
        "qwen35",
        False,
        True,
        "padded_batch",
        ["one packed row per rank (batch size 1)", "HFPacker", "DataCollatorWithFlattening"],
    ),
    "qwen35-padded-row": (
        "qwen35",
        False,
        True,
        "padded_row",
        ["3 of 15 tokens as padding", "HFPacker", "DataCollatorWithFlattening"],
    ),
    "qwen35-three-row-positions": (
        "qwen35",
        False,
        True,
        "three_rows",
        ["[4, 1, L]", "(3, 1, 12)"],
    ),
}


def rank_cases(rank, world):
    """Every refused case in one launch of the ranks, each with a fresh model; and PaliGemma
    with its tower balanced and with nothing balanced."""
    out = {case: rank_main(rank, world, *a[:3], True, a[3]) for case, a in REFUSED.items()}
    out["paligemma-tower"] = rank_main(rank, world, "paligemma", True, False, True, "none")
    out["paligemma-plain"] = rank_main(rank, world, "paligemma", True, False, False, "none")
    out["paligemma-unwrapped"] = rank_main(rank, world, "paligemma", False, False, False, "none")
    return out


@functools.cache
def cases() -> dict[str, list]:
    runs = run_ranks(rank_cases, 2, timeout=300)
    return {k: [r[k] for r in runs] for k in runs[0]}


@functools.cache
def paligemma_mask_joins_samples() -> bool:
    """Whether the installed transformers' PaliGemma mask over a packed row lets one sample
    see another, read off the mask its decoder gets (up to 5.23 the bidirectional prefix
    block spans every sample of the row; 5.24 keeps it to each sample's own prefix)."""
    model, batch = _paligemma(0)
    decoder = model.model.language_model
    forward, seen = decoder.forward, {}

    def spy(*args, **kwargs):
        seen["mask"] = kwargs["attention_mask"]
        return forward(*args, **kwargs)

    decoder.forward = spy
    with torch.no_grad():
        model(**batch, use_cache=False)
    allowed = seen["mask"][0, 0].bool()
    sample = (batch["position_ids"][0] == 0).cumsum(0)
    return bool((allowed & (sample[:, None] != sample[None, :])).any())


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_with_a_clear_error_on_every_rank(case):
    if case == "paligemma-prefix-across-samples" and not paligemma_mask_joins_samples():
        # this transformers keeps each sample's prefix to itself: nothing to refuse, and the
        # balanced step (samples moved) equals the unbalanced one
        both, plain = cases()[case], cases()["paligemma-unwrapped"]  # its tower unwrapped too
        for (loss, grads, _, _), (loss0, grads0, _, _) in zip(both, plain, strict=True):
            # HF's loss runs in float32 (test_hf_parity's tolerance)
            assert loss == pytest.approx(loss0, rel=1e-6)
            np.testing.assert_allclose(grads, grads0, rtol=1e-5, atol=1e-9)
        assert both[0][2] > 0
        return
    for message in cases()[case]:
        assert isinstance(message, str), "the step ran where it must be refused"
        for word in REFUSED[case][4]:
            assert word in message


def test_paligemma_tower_balances():
    """PaliGemma's vision tower balances (rank 0 holds three images, rank 1 one) and the step
    equals the one without balancing: only its decoder is refused."""
    tower, plain = cases()["paligemma-tower"], cases()["paligemma-plain"]
    for (loss, grads, _, moved), (loss0, grads0, _, moved0) in zip(tower, plain, strict=True):
        assert loss == pytest.approx(loss0, rel=1e-12)
        np.testing.assert_allclose(grads, grads0, rtol=1e-10, atol=1e-12)
        assert moved > 0 and moved0 == 0


def test_crossing_masks_finds_masks_that_join_samples():
    """Block-diagonal masks (causal or with bidirectional blocks inside a sample) cross
    nothing; one allowed entry outside the samples' blocks is found, bool or additive."""
    from trainer_adapter.hf.masks import crossing_masks

    lengths = np.array([3, 2, 4])
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    own = causal & torch.block_diag(*[torch.ones(n, n, dtype=torch.bool) for n in lengths])
    inside = own.clone()
    inside[3, 4] = True  # a bidirectional pair inside the second sample
    leak = own.clone()
    leak[5, 4] = True  # the third sample sees the second's last token
    masks = {"a": own[None, None], "b": inside[None, None], "c": leak[None, None], "d": None}
    assert crossing_masks(masks, lengths) == ["c"]
    for mask, crossing in ((own, []), (leak, ["attention_mask"])):  # eager attention's kind
        additive = torch.zeros(9, 9, dtype=torch.float64).masked_fill(~mask, -1e300)
        assert crossing_masks({"": additive[None, None]}, lengths) == crossing
    assert crossing_masks({"": causal[None, None]}, np.array([9])) == []  # one sample
    assert crossing_masks({"": causal[None, None]}, lengths) == ["attention_mask"]


def test_crossing_masks_equal_a_brute_force_over_token_pairs():
    """Reference: a mask crosses when some allowed (query, key) pair lies in two samples; rows
    of one to four samples (two: the smallest row that can cross), bool and additive."""
    from trainer_adapter.hf.masks import crossing_masks

    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths = rng.integers(1, 4, int(rng.integers(1, 5)))
        seg = np.repeat(np.arange(len(lengths)), lengths)
        n = int(lengths.sum())
        allowed = torch.from_numpy((seg[:, None] == seg[None, :]) & (rng.random((n, n)) < 0.7))
        if rng.random() < 0.5:  # one stray pair, anywhere
            allowed[int(rng.integers(n)), int(rng.integers(n))] = True
        want = any(bool(allowed[i, j]) and seg[i] != seg[j] for i in range(n) for j in range(n))
        additive = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))
        for mask in (allowed, additive):
            assert crossing_masks({"m": mask[None, None]}, lengths) == (["m"] if want else [])


@pytest.mark.parametrize("seed", range(5))
def test_packing_kwargs_equal_the_collators(seed):
    """The packing kwargs built for a rank's received samples equal what transformers'
    DataCollatorWithFlattening gives for a row of those samples, and check_decoder accepts
    the collator's kwargs for that row and refuses them for another."""
    from transformers import DataCollatorWithFlattening

    from trainer_adapter.hf.packing import check_decoder, packing_kwargs, packing_spec

    lengths = np.random.default_rng(seed).integers(1, 30, size=int(seed) + 1)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    want = collator([{"input_ids": list(range(3, 3 + n))} for n in lengths], return_tensors="pt")
    packing = {k: want[k] for k in want if k not in ("input_ids", "labels", "position_ids")}
    spec = packing_spec(packing)
    got = packing_kwargs({"use_cache": False}, spec, lengths, torch.device("cpu"))
    assert got["use_cache"] is False
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx", "max_length_q", "max_length_k"):
        if isinstance(want[key], torch.Tensor):
            assert got[key].dtype == want[key].dtype
            assert got[key].tolist() == want[key].tolist(), key
        else:
            assert got[key] == want[key], key
    decoder = torch.nn.Linear(1, 1)
    check_decoder(decoder, packing, lengths, spec)
    with pytest.raises(ValueError, match="sample boundaries"):
        check_decoder(decoder, packing, np.append(lengths[:-1], [lengths[-1] + 1]), spec)


@pytest.mark.parametrize(
    "layer_types, model_type, packed, refused",
    [
        (["full_attention", "sliding_attention", "chunked_attention"], "llama4_text", False, ""),
        (["linear_attention", "full_attention"], "qwen3_5_text", True, ""),
        (["linear_attention", "full_attention"], "qwen3_5_text", False, "pass HF's packing"),
        # Nemotron-H: its MLP and MoE layers carry nothing, its Mamba layers do
        (["linear_attention", "moe", "full_attention", "mlp"], "nemotron_h", True, "(nemotron_h)"),
        (["hybrid", "hybrid"], "falcon_h1", True, "hybrid layers"),
        (["conv", "full_attention"], "lfm2", True, "conv layers"),
        # GLM-5-Next: its linear attention takes no packing kwargs; indexed attention is masked
        (["linear_attention", "indexed_attention"], "glm5_next_text", True, "(glm5_next_text)"),
    ],
)
def test_recurrent_decoders(layer_types, model_type, packed, refused):
    """Decoders with layers that carry state along the row are balanced only where their
    transformers code takes the packing kwargs, and then only with them; the error names the
    state-carrying kinds and no stateless ones."""
    import types

    from trainer_adapter.hf.packing import check_decoder

    decoder = torch.nn.Linear(1, 1)
    decoder.config = types.SimpleNamespace(layer_types=layer_types, model_type=model_type)
    lengths = np.array([3, 4])
    kw = {"seq_idx": torch.tensor([[0, 0, 0, 1, 1, 1, 1]], dtype=torch.int32)} if packed else {}
    spec = {"seq_idx": "torch.int32"} if packed else {}
    if not refused:
        check_decoder(decoder, kw, lengths, spec)
        return
    with pytest.raises(ValueError) as e:
        check_decoder(decoder, kw, lengths, spec)
    assert refused in str(e.value)
    assert "moe" not in str(e.value).split("layers")[0] and "mlp" not in str(e.value)


def test_tower_whose_inputs_cannot_move_refused_when_wrapped():
    """PaddleOCR-VL's tower takes grid_thw but its patches as [1, N, C, p, p] with no Qwen-style
    patch embedding: balance_model refuses it when wrapping (no step starts, no rank waits),
    and the decoder alone still wraps."""
    import transformers as tf

    from trainer_adapter.hf.balance import balance_model

    with torch.device("meta"):  # the structure only: nothing runs
        model = tf.PaddleOCRVLForConditionalGeneration(tf.PaddleOCRVLConfig())
    with pytest.raises(ValueError, match=r"PaddleOCRVisionModel takes grid_thw .* encoder=False"):
        balance_model(model)
    balance_model(model, encoder=False)
    assert hasattr(model.model.language_model, "equishard_paused")


@pytest.mark.parametrize(
    "setting, masks, joins",
    [
        (True, None, True),  # PaliGemma's Gemma given no mask: the whole row
        ("all", {"full_attention": None}, True),  # Gemma 4's "all", no mask built
        ("vision", None, False),  # Gemma 4's "vision": each image's own tokens only
        (False, None, False),
        (None, None, False),
        (True, {"full_attention": torch.ones(1, 1, 4, 4, dtype=torch.bool)}, False),  # it follows
    ],
)
def test_bidirectional_decoder_given_no_mask_joins_samples(setting, masks, joins):
    import types

    from trainer_adapter.hf.masks import bidirectional_without_masks

    decoder = types.SimpleNamespace(
        config=types.SimpleNamespace(use_bidirectional_attention=setting)
    )
    found = bidirectional_without_masks(decoder, masks)
    assert bool(found) == joins
    assert not found or "use_bidirectional_attention" in found[0]


class _FramesMergedTower(torch.nn.Module):
    """A grid_thw tower that averages a video's frames into one grid (``h*w`` rows out for
    ``t*h*w`` in), as Kimi-K2.5's temporal merge does: its rows per item are no fixed
    fraction of its input's."""

    def __init__(self):
        import types

        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=4, num_hidden_layers=1)
        self.patch_embed = torch.nn.Linear(6, 4)

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        x, out, start = self.patch_embed(hidden_states), [], 0
        for t, h, w in grid_thw.tolist():
            out.append(x[start : start + t * h * w].reshape(t, h * w, -1).mean(0))
            start += t * h * w
        return torch.cat(out)


def frames_merged_rank(rank, world):
    from trainer_adapter.hf.towers import balance_vision
    from trainer_adapter.redistribute import RedistributePolicy

    torch.manual_seed(0)
    tower = _FramesMergedTower()
    grids = ([[2, 2, 2]], [[1, 2, 2], [1, 2, 2]])[rank]  # rank 0: a video, rank 1: 2 images
    grid = torch.tensor(grids)
    x = torch.randn(int(grid.prod(-1).sum()), 6)
    balance_vision(tower, policy=RedistributePolicy(placement="identity"))
    try:
        tower(x, grid_thw=grid)
    except ValueError as e:
        return str(e)
    return None


def test_tower_whose_rows_per_item_vary_refused_on_every_rank():
    """Routing a tower's outputs home by one ratio of rows out per row in (rank 0's: half, as
    its video's two frames merge) would give rank 1's images half their rows, silently (the
    ratios divide evenly): every rank refuses, naming the ratios it saw."""
    for message in run_ranks(frames_merged_rank, 2, timeout=120):
        assert message is not None, "the step ran where it must be refused"
        assert "not a fixed number of rows per input row" in message
        assert "encoder=False" in message


@pytest.mark.parametrize("grid", [[[-1, -2, 8]], [[1, 0, 4], [1, 2, 2]], [[2, -2, -4]]])
def test_grid_thw_with_negative_or_zero_entries_is_refused(grid):
    """Issue #37 item 12: negative grids whose product matches the patch rows (bug: accepted,
    and the route was planned on nonsense image shapes)."""
    from trainer_adapter.hf.towers import _grid_table

    g = torch.tensor(grid)
    rows = max(int(g.prod(dim=1).sum()), 0)
    with pytest.raises(ValueError, match="must be >= 1"):
        _grid_table(torch.zeros(rows, 4), g, "Tower")
    good = torch.tensor([[1, 2, 8]])
    assert _grid_table(torch.zeros(16, 4), good, "Tower").tolist() == [[16, 1, 2, 8]]


def _joined_on_rank0(rank, world):
    """PaliGemma balanced with the decoder's masks reported as joining samples on rank 0 only
    (as transformers <= 5.23 built its prefix mask over a packed row; rank 1's row holds one
    sample, which crosses nothing)."""
    import trainer_adapter.hf.decoder_row as decoder

    found = decoder.crossing_masks
    decoder.crossing_masks = lambda masks, lengths: ["attention_mask"] if rank == 0 else []
    try:
        return rank_main(rank, world, "paligemma", False, True, True, "none")
    finally:
        decoder.crossing_masks = found


def test_a_mask_joining_samples_on_one_rank_is_refused_on_every_rank():
    """The refusal is agreed: a rank whose own row crosses nothing refuses too, instead of
    waiting in an exchange the refusing rank never joins (independent of which transformers
    builds such masks; test_refused_with_a_clear_error_on_every_rank covers a real one where
    the installed transformers has it)."""
    got = run_ranks(_joined_on_rank0, 2, timeout=180)
    for message in got:
        assert isinstance(message, str), "the step ran where it must be refused"
        assert "attention_mask" in message and "attend to each other" in message
