"""The vision towers :func:`balance_model` wraps across the VLM architectures of the installed
``transformers``, beyond the families of test_hf_parity (not MiniCPM-V's or Inkling2's, whose
per-image sizes beside the pixels it refuses): on 2 gloo ranks with uneven images (3 and 1),
and with one rank without images (2 and 0: it joins the round through ``equishard_settle``, as
the balanced decoder makes it), the balanced tower's outputs on each rank equal the tower's own
on that rank's images, and the gradients summed over the ranks equal those of the unwrapped
tower, the reference computed first in the same process with equishard not involved. Images
must move.

Each architecture is its own default config made tiny (hidden sizes and depths cut, patch and
image sizes kept but for the towers of SMALLER_IMAGES) in float64, in eval mode (no dropout
or drop-path, whose random draws depend on which images a rank holds). Inputs are generic:
``[N, C, H, W]`` tiles of the config's image size for tile towers; for towers that take
``grid_thw``, patch rows of grids that are multiples of the merge size (Kimi-K2.5's as
``[C, p, p]`` patches); Molmo2's crops of patch rows; for Pixtral's, images of their own sizes.
This checks the wrapper, not the model's own inputs (test_hf_parity does that for its families,
whole model and loss). Towers balance_model refuses to wrap (a ``grid_thw`` with no Qwen-style
patch rows) are checked to be refused with the way out named. A model type missing from the
installed ``transformers`` is skipped."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from tests.dist_helper import run_ranks
from tests.sweeps import sweep

pytest.importorskip("transformers")

# checked here on generic inputs (transformers 5.24); the parity families are in the list too,
# as a check of the generic harness against towers whose wrappers test_hf_parity proves
TOWERS = (
    "aria",
    "aya_vision",
    "blip-2",
    "cohere2_vision",
    "cosmos3_omni",
    "deepseek_vl",
    "deepseek_vl_hybrid",
    "dots3_note",
    "exaone4_5",
    "gemma3",
    "glm46v",
    "glm4v",
    "glm4v_moe",
    "glm5_next",
    "glm_ocr",
    "glmga",
    "got_ocr2",
    "granite_docling",
    "hyperclovax_vision_v2",
    "idefics2",
    "idefics3",
    "instructblip",
    "instructblipvideo",
    "internvl",
    "janus",
    "kimi_k25",
    "kosmos-2",
    "lfm3_vl",
    "llava",
    "llava_next",
    "llava_next_video",
    "llava_onevision",
    "mistral3",
    "mistral_large4",
    "molmo2",
    "nemotron_h_omni",
    "ovis2",
    "paligemma",
    "pp_chart2table",
    "qianfan_ocr",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen4_exp",
    "shieldgemma2",
    "smolvlm",
    "step3p7",
    "vipllava",
)
# towers that take grid_thw without Qwen-style patch rows: refused when wrapping
REFUSED = (
    "cosmos3_edge",
    "hy_v4_vl",
    "minimax_m3_vl",
    "muse_glimmer",
    "muse_spark",
    "paddleocr_vl",
)

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "out_hidden_size": 32,
    "depth": 2,
    "num_heads": 2,
    "embed_dim": 32,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 32,
    "projector_hidden_size": 32,
    "num_local_experts": 4,  # dots3_note's tower
    "adapter_in_dim": 32,
    "adapter_out_dim": 32,
    "linear_num_heads": 2,  # GLM-5-Next's linear attention: a depthwise conv per channel
    "linear_head_dim": 16,
    "ffn_dim": 64,  # OPT's (BLIP-2's decoder)
    "word_embed_proj_dim": 32,
    # embeddings of the token ids, which no test here feeds (towers take pixels, decoders
    # inputs_embeds): 256k rows were most of a build and of the gradients all-reduced
    "vocab_size": 1024,
}


# towers whose default images cost seconds a step in float64 (GOT-OCR2's 1024-px SAM encoder:
# 4,096 patches; Step3p7's 728 px) or most of their run (tiles of 384-512 px), at a smaller
# size their position tables are built for (a multiple of patch x merge): the wrapper moves
# whole tiles whatever their size
SMALLER_IMAGES = {
    "got_ocr2": 256,
    "pp_chart2table": 256,
    "step3p7": 224,
    "cohere2_vision": 256,
    "qianfan_ocr": (224, 224),
    "internvl": (224, 224),
    "granite_docling": 256,
    "aya_vision": 224,
    "llava_onevision": 224,
    "janus": 224,
}
# Ovis2's visual tokenizer ends in a 16k-way softmax over every patch: a 1k one still checks it
SMALLER_VISION = {"ovis2": {"vocab_size": 1024}}
# Janus's image-generation side (a VQ model and its 16k-code head, 110M of its 120M weights at
# default widths), never run by these tests, cut to its smallest widths: built in milliseconds
SMALLER_VQ = {
    "janus": {
        "base_channels": 32,  # GroupNorm of 32 groups
        "latent_channels": 32,
        "projection_dim": 32,
        "image_token_embed_dim": 32,
        "num_embeddings": 1024,
    }
}


def _installed(model_type: str) -> str | None:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as MODELS,
    )

    return MODELS.get(model_type)


def _require(model_type: str) -> None:
    """Skip the test where the installed ``transformers`` has no ``model_type``."""
    if _installed(model_type) is None:
        pytest.skip(f"this transformers has no {model_type}")


def _tiny(cfg):
    """The config with its widths and depths cut, every sub-config too (sizes of patches and
    images kept, so inputs keep their shapes)."""
    import transformers as tf

    for key, value in list(vars(cfg).items()):
        if isinstance(value, tf.PretrainedConfig):
            _tiny(value)
        elif key in TINY and isinstance(value, int) and not isinstance(value, bool):
            setattr(cfg, key, TINY[key])
        elif key == "layer_types" and isinstance(value, list):
            setattr(cfg, key, value[: TINY["num_hidden_layers"]])
    pad = getattr(cfg, "pad_token_id", None)
    if isinstance(pad, int) and pad >= getattr(cfg, "vocab_size", pad + 1):
        cfg.pad_token_id = cfg.vocab_size - 1  # an embedding's padding row: in its table
    return cfg


def build(model_type: str) -> torch.nn.Module:
    import transformers as tf
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = _tiny(CONFIG_MAPPING[model_type]())
    if model_type in SMALLER_IMAGES:
        cfg.vision_config.image_size = SMALLER_IMAGES[model_type]
    for key, value in SMALLER_VISION.get(model_type, {}).items():
        setattr(cfg.vision_config, key, value)
    for key, value in SMALLER_VQ.get(model_type, {}).items():
        setattr(cfg.vq_config, key, value)
    torch.manual_seed(0)
    model = getattr(tf, _installed(model_type))(cfg)
    return model.double().eval()


def tower_of(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "model", model)
    return next(
        getattr(inner, a) for a in ("visual", "vision_tower", "vision_model") if hasattr(inner, a)
    )


def images(model_type: str, tower: torch.nn.Module, rank: int, n: int) -> tuple[tuple, dict]:
    """``n`` generic images for the tower: tiles, or patch rows with their grids."""
    g = torch.Generator().manual_seed(100 + rank)
    cfg = tower.config
    channels = getattr(cfg, "in_channels", getattr(cfg, "num_channels", 3))
    if model_type == "molmo2":  # crops of patch rows: [crops, patches, p * p * C]
        side = cfg.image_size[0] // cfg.patch_size
        size = (side * side, cfg.patch_size**2 * channels)
        return (torch.randn(n, *size, generator=g, dtype=torch.float64),), {}
    if "grid_thw" in inspect.signature(tower.forward).parameters:
        p, merge = cfg.patch_size, getattr(cfg, "spatial_merge_size", 1) or 1
        merge = getattr(cfg, "merge_kernel_size", (merge,))[0]  # Kimi-K2.5's
        row = (channels * p * p * (getattr(cfg, "temporal_patch_size", 1) or 1),)
        if model_type == "kimi_k25":  # its Conv2d takes [C, p, p] patches
            row = (channels, p, p)
        grid = torch.tensor(
            [[1, merge * (1 + (i + rank) % 3), merge * (2 + i % 2)] for i in range(n)]
        )
        rows = int(grid.prod(-1).sum())
        return (torch.randn(rows, *row, generator=g, dtype=torch.float64),), {"grid_thw": grid}
    if "image_sizes" in inspect.signature(tower.forward).parameters:  # Pixtral: own sizes
        p = cfg.patch_size
        sizes = torch.tensor([[p * (2 + (i + rank) % 3), p * (4 - i % 3)] for i in range(n)])
        pixels = torch.randn(n, channels, 4 * p, 4 * p, generator=g, dtype=torch.float64)
        return (pixels,), {"image_sizes": sizes}
    size = cfg.image_size if isinstance(cfg.image_size, list | tuple) else (cfg.image_size,) * 2
    return (torch.randn(n, channels, *size, generator=g, dtype=torch.float64),), {}


def _floats(out) -> list[torch.Tensor]:
    """Every floating tensor of a tower's output (hidden states of every layer included)."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for o in out for t in _floats(o)]
    return []


def step(tower, args, kw, settle: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The tower's outputs and its gradients for a fixed random weighting of every output;
    no images: none (``args`` None). ``settle``: the balanced tower's rounds are settled before
    the backward (a rank without images joins them there), as the balanced decoder does."""
    outs = _floats(tower(*args, **kw)) if args is not None else []
    g = torch.Generator().manual_seed(7)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in outs)
    if settle:
        loss = loss + tower.equishard_settle().sum()
    tower.zero_grad()
    loss.backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in tower.parameters()]
    return [t.detach() for t in outs], torch.cat([x.reshape(-1) for x in grads])


def mismatch(outs, ref_outs, grads, ref_grads) -> str | None:
    """Why a balanced step differs from the reference (``None``: it does not): outputs equal on
    this rank, gradients summed over the ranks equal. Checked on the ranks, which return only
    this (a run's gradients are GBs: vocabularies of 256k rows)."""
    try:
        assert len(outs) == len(ref_outs), f"{len(outs)} outputs, the reference {len(ref_outs)}"
        for out, ref in zip(outs, ref_outs, strict=True):
            torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
        # some models run parts in float32 (RMSNorm, position interpolation, Cohere's layer
        # norms) whatever the dtype
        scale = float(ref_grads.abs().max())
        assert scale > 0, "the reference has no gradient"
        torch.testing.assert_close(grads, ref_grads, rtol=0, atol=1e-6 * scale)
    except AssertionError as e:
        return str(e)
    return None


def rank_main(rank, world, model_type):
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model
    from trainer_adapter.redistribute import RedistributePolicy

    model = build(model_type)
    tower = tower_of(model)
    inputs = {  # no images on this rank: no call of its own
        case: images(model_type, tower, rank, n[rank]) if n[rank] else (None, {})
        for case, n in CASES.items()
    }
    # the tower alone, this rank's images (none: no call, gradients zero)
    refs = {case: step(tower, *x) if x[0] is not None else None for case, x in inputs.items()}
    balance_model(model, llm=False, policy=RedistributePolicy(placement="identity"))
    results = {}
    for case, x in inputs.items():
        outs, grads = step(tower, *x, settle=True)
        ref_outs, ref_grads = refs[case] or ([], torch.zeros_like(grads))
        dist.all_reduce(ref_grads)
        dist.all_reduce(grads)
        results[case] = (mismatch(outs, ref_outs, grads, ref_grads), tower.last_route.moved)
    return results


@functools.cache
def runs(model_type: str) -> list[dict]:
    """Both cases of one architecture on 2 ranks (one run per architecture: a slow machine
    stays far from the timeouts, and a failure names its model)."""
    return run_ranks(rank_main, 2, model_type, timeout=300)


# images on rank 0 and rank 1
CASES = {"uneven": (3, 1), "empty_rank": (2, 0)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "model_type",
    # make test: Qwen-style patch rows (dense, MoE), square crops, tiles, Kosmos's wrapper,
    # Pixtral's own sizes; the rest in make test-slow
    sweep(
        "a balanced tower equals the tower alone",
        TOWERS,
        fast=(
            "qwen2_vl",
            "glm4v_moe",
            "llava",
            "internvl",
            "idefics3",
            "kosmos-2",
            "mistral3",
            "molmo2",
        ),
    ),
)
def test_balanced_tower_equals_the_tower_alone(model_type, case):
    _require(model_type)
    for rank, result in enumerate(runs(model_type)):
        wrong, moved = result[case]
        assert moved > 0, "no image moved: nothing was checked"
        assert wrong is None, f"rank {rank}: {wrong}"


@pytest.mark.parametrize("model_type", REFUSED)
def test_tower_without_patch_rows_refused_when_wrapping(model_type):
    """No step starts (no rank waits); the error names the tower and ``encoder=False``, with
    which the decoder alone still balances."""
    import transformers as tf
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from trainer_adapter.hf.balance import balance_model

    _require(model_type)
    with torch.device("meta"):  # the structure only: nothing runs
        model = getattr(tf, _installed(model_type))(_tiny(CONFIG_MAPPING[model_type]()))
    name = type(tower_of(model)).__name__
    with pytest.raises(ValueError, match=rf"{name} takes grid_thw .* encoder=False"):
        balance_model(model)
    balance_model(model, encoder=False)
    assert any(hasattr(m, "equishard_paused") for m in model.modules())


# The language models balance_model wraps, on one generic packed row per rank (samples of 5, 9
# and 3 tokens on rank 0, one of 4 on rank 1, or an empty row there; inputs_embeds and
# positions restarting per sample): the balanced decoder's hidden states and summed gradients
# equal the plain one's.
DECODERS = (
    "aya_vision",
    "cohere2_vision",
    "cosmos3_omni",
    "deepseek_vl",
    "exaone4_5",
    "gemma3",
    "got_ocr2",
    "granite_docling",
    "hyperclovax_vision_v2",
    "idefics2",
    "idefics3",
    "internvl",
    "janus",
    "llava",
    "llava_next_video",
    "llava_onevision",
    "mistral3",
    "ovis2",
    "qianfan_ocr",
    "qwen3_vl",
    "shieldgemma2",
    "smolvlm",
    "vipllava",
)
# refused on every rank with the reason: recurrent layers that ignore the packing kwargs, linear
# attention given none, a bidirectional decoder (PaliGemma's default Gemma) given no mask
DECODERS_REFUSED = {
    "glm5_next": "linear_attention layers",
    "lfm3_vl": "conv layers",
    "qwen3_5": "pass HF's packing kwargs",
    "paligemma": "use_bidirectional_attention",
}


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", None) or inner.text_model


# sample lengths on rank 0 and rank 1 (none: an empty row, as a rank without samples calls it)
DECODER_CASES = {"uneven": ((5, 9, 3), (4,)), "empty_rank": ((5, 9, 3), ())}


def decoder_step(decoder, lengths: tuple[int, ...], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(1, sum(lengths), decoder.config.hidden_size, generator=g, dtype=torch.float64)
    positions = torch.cat([torch.arange(n) for n in (*lengths, 0)])[None]
    hidden = decoder(inputs_embeds=x, position_ids=positions, use_cache=False).last_hidden_state
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(9), dtype=x.dtype)
    decoder.zero_grad()
    (hidden * weights).sum().backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in decoder.parameters()]
    return hidden.detach(), torch.cat([x.reshape(-1) for x in grads])


def decoder_main(rank, world, model_type):
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model
    from trainer_adapter.redistribute import RedistributePolicy

    model = build(model_type)
    decoder = decoder_of(model)
    cases = {c: n[rank] for c, n in DECODER_CASES.items()}
    if model_type in DECODERS_REFUSED:
        cases = {"uneven": cases["uneven"]}
    # the decoder alone on this rank's samples (none: no call, gradients zero)
    refs = {c: decoder_step(decoder, n, rank) if n else None for c, n in cases.items()}
    balance_model(model, encoder=False, policy=RedistributePolicy(placement="identity"))
    results = {}
    for case, lengths in cases.items():
        try:
            hidden, grads = decoder_step(decoder, lengths, rank)
        except ValueError as e:
            results[case] = str(e)
            continue
        if model_type in DECODERS_REFUSED:  # ran where it must be refused
            results[case] = None
            continue
        ref_hidden, ref_grads = refs[case] or (hidden[:, :0], torch.zeros_like(grads))
        dist.all_reduce(ref_grads)
        dist.all_reduce(grads)
        wrong = mismatch([hidden], [ref_hidden], grads, ref_grads)
        results[case] = (wrong, decoder.last_route.moved)
    return results


@functools.cache
def decoder_runs(model_type: str) -> list[dict]:
    """One run per architecture, as for the towers."""
    return run_ranks(decoder_main, 2, model_type, timeout=300)


@pytest.mark.parametrize("case", list(DECODER_CASES))
@pytest.mark.parametrize(
    "model_type",
    sweep(
        "a balanced decoder equals the decoder alone",
        DECODERS,
        fast=("qwen3_vl", "gemma3", "cohere2_vision", "llava", "smolvlm"),
    ),
)
def test_balanced_decoder_equals_the_decoder_alone(model_type, case):
    _require(model_type)
    for rank, result in enumerate(decoder_runs(model_type)):
        assert not isinstance(result[case], str), result[case]  # refused
        wrong, moved = result[case]
        assert moved > 0, "no sample moved: nothing was checked"
        assert wrong is None, f"rank {rank}: {wrong}"


@pytest.mark.parametrize("model_type", list(DECODERS_REFUSED))
def test_decoder_that_mixes_packed_samples_refused_on_every_rank(model_type):
    _require(model_type)
    for result in decoder_runs(model_type):
        message = result["uneven"]
        assert isinstance(message, str), "the step ran where it must be refused"
        assert DECODERS_REFUSED[model_type] in message
        assert "llm=False" in message or "packing kwargs" in message


def test_encoder_decoder_language_model_refused_when_wrapping():
    """Florence-2's language model is BART, an encoder-decoder: its samples are not one packed
    decoder row, so balance_model refuses its LLM side when wrapping, naming ``llm=False``,
    with which the tower alone is wrapped (not run: its DaViT tower is not in the sweep)."""
    import transformers as tf

    from trainer_adapter.hf.balance import balance_model

    _require("florence2")
    with torch.device("meta"):  # the structure only: nothing runs
        model = tf.Florence2ForConditionalGeneration(tf.Florence2Config())
    with pytest.raises(ValueError, match=r"BartModel is an encoder-decoder .* llm=False"):
        balance_model(model)
    balance_model(model, llm=False)
    assert hasattr(tower_of(model), "equishard_paused")


# towers given per-image sizes beside their pixels, which the tile wrapper does not move with
# the tiles (a receiving rank would run another rank's images with its own sizes)
SIZED = {
    "minicpmv4_6": "target_sizes",
    "minicpmv4_7": "target_sizes",
    "minicpm_ocr": "target_sizes",
    "inkling2": "image_grid_thw",
}


def sized_main(rank, world):
    from trainer_adapter.group_errors import StepRefused
    from trainer_adapter.hf.balance import balance_model

    messages = {}
    for model_type, key in SIZED.items():
        if _installed(model_type) is None:
            continue
        model = build(model_type)
        tower = tower_of(model)
        balance_model(model, llm=False)
        n = (2, 1)[rank]  # the model's own call: pixels and one size row per image
        sizes = torch.tensor([[1, 2, 2]] * n) if key == "image_grid_thw" else torch.ones(n, 2)
        try:
            tower(pixel_values=torch.zeros(n, 3, 4, 4, dtype=torch.float64), **{key: sizes})
            messages[model_type] = None
        except StepRefused as e:
            messages[model_type] = str(e)
    return messages


@functools.cache
def sized_runs() -> list[dict]:
    return run_ranks(sized_main, 2, timeout=300)


@pytest.mark.parametrize("model_type", list(SIZED))
def test_tower_given_per_image_sizes_refused_on_every_rank(model_type):
    """MiniCPM-V's ``target_sizes``, Inkling2's ``image_grid_thw``: every rank stops before
    any image moves, naming the input and the way out (``encoder=False``)."""
    _require(model_type)
    for message in sized_runs():
        assert message[model_type] is not None, "the step ran where it must be refused"
        assert f"`{SIZED[model_type]}`" in message[model_type]
        assert "encoder=False" in message[model_type]


def kimi_videos_main(rank, world):
    from trainer_adapter.group_errors import StepRefused
    from trainer_adapter.hf.balance import balance_model
    from trainer_adapter.redistribute import RedistributePolicy

    model = build("kimi_k25")
    tower = tower_of(model)
    balance_model(model, llm=False, policy=RedistributePolicy(placement="identity"))
    # rank 0: two 2-frame videos and an image, rank 1: an image, all 16 patch rows; a video
    # moves and each rank then runs a video and an image: the same ratio on both ranks
    grid = torch.tensor(([[2, 2, 4], [2, 2, 4], [1, 4, 4]], [[1, 4, 4]])[rank])
    p = tower.config.patch_size
    x = torch.randn(int(grid.prod(-1).sum()), 3, p, p, dtype=torch.float64)
    try:
        tower(x, grid_thw=grid)
    except StepRefused as e:
        return str(e)
    return None


def test_frame_merging_tower_with_videos_refused_on_every_rank():
    """Kimi-K2.5's tower merges a video's frames (``h*w`` rows out for ``t*h*w`` in): routed
    home by one ratio of rows, the rows of the video each rank runs beside an image would be
    split wrongly, the totals right (the ratios agree, so ``route_home``'s check cannot see
    it). Every rank refuses, naming the videos; images alone balance (the sweep above)."""
    _require("kimi_k25")
    for message in run_ranks(kimi_videos_main, 2, timeout=300):
        assert message is not None, "the step ran where it must be refused"
        assert "temporal_merge" in message and "rank 0 of 2: 2 video(s)" in message
        assert "encoder=False" in message
