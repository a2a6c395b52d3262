"""What the HF balancing wrappers refuse, on real architectures (tiny configs, random weights):
inputs they cannot move with the items, which would make a receiving rank run another rank's
images or samples with its own data. Every rank gets the same clear error at the same point
(no rank left hanging in a collective).

- Mllama: the tower takes each image's aspect ratios beside it, the decoder the images'
  cross-attention states per sample;
- Qwen3.5: linear-attention layers carry state across a packed row's samples unless given
  HF's packing kwargs;
- packing kwargs or positions that do not describe the row.
(Mistral 3's Pixtral tower, with each image's size beside it, was refused here too until it
got a wrapper of its own: see test_hf_parity.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_parity import TEXT, qwen35_config

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


MODELS = {"mllama": _mllama, "qwen35": _qwen35}


def rank_main(rank, world, name, encoder, llm, enabled, change):
    """One step of model ``name`` on this rank with ``balance_model(encoder=, llm=)`` and the
    policy ``enabled`` or not; the error message if it refused, else the loss and gradients
    summed over ranks and the samples the decoder moved. ``change`` alters the row first."""
    import torch.distributed as dist

    from trainer_adapter.hf_balance import balance_model
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
    return float(loss), grads.numpy(), route.moved if route else 0


def _wrong_boundaries(batch):
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)  # the row's samples are 5 + 5 + 2 long
    return {**batch, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 8}


def _three_row_positions(batch):  # Qwen's mrope positions without the text row
    return {**batch, "position_ids": batch["position_ids"].expand(3, 1, -1)}


CHANGES = {
    "none": lambda b: b,
    "wrong_boundaries": _wrong_boundaries,
    "three_rows": _three_row_positions,
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
    "qwen35-wrong-boundaries": (
        "qwen35",
        False,
        True,
        "wrong_boundaries",
        ["cu_seq_lens_q", "[0, 4, 12]", "[0, 5, 10"],
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
    """Every refused case in one launch of the ranks, each with a fresh model."""
    return {
        case: rank_main(rank, world, *args[:3], True, args[3]) for case, args in REFUSED.items()
    }


@functools.cache
def cases() -> dict[str, list]:
    runs = run_ranks(rank_cases, 2, timeout=300)
    return {k: [r[k] for r in runs] for k in runs[0]}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_with_a_clear_error_on_every_rank(case):
    for message in cases()[case]:
        assert isinstance(message, str), "the step ran where it must be refused"
        for word in REFUSED[case][4]:
            assert word in message


@pytest.mark.parametrize("seed", range(5))
def test_packing_kwargs_equal_the_collators(seed):
    """The packing kwargs built for a rank's received samples equal what transformers'
    DataCollatorWithFlattening gives for a row of those samples, and check_decoder accepts
    the collator's kwargs for that row and refuses them for another."""
    from transformers import DataCollatorWithFlattening

    from trainer_adapter.hf_packing import check_decoder, packing_kwargs, packing_spec

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
