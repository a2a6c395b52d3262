"""Runtime balancing inside a real Hugging Face Qwen2-VL (tiny config, random weights) on 4 gloo
ranks with uneven batches, an image-less rank and an empty rank: the loss and every
parameter's gradient, with encoder and LLM balancing, without balancing, and from a single
process over the concatenated global batch, agree to float64 precision; samples really move."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks

transformers = pytest.importorskip("transformers")

IMG, VSTART, VEND = 999, 997, 996
# per rank: samples as (text tokens before, image grid (t, h, w) or None, text tokens after)
LAYOUT = [
    [(5, (1, 8, 10), 7), (3, (1, 8, 8), 4), (2, (1, 6, 8), 2), (9, None, 0)],  # three images
    [],  # an empty rank
    [(4, (1, 4, 4), 6)],  # one small image
    [(30, None, 0), (25, None, 3), (40, None, 0)],  # long text-only samples: no pixel_values
]


def build_model(seed: int = 0):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=1000,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
            max_position_embeddings=4096,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=16,
            hidden_size=32,
            num_heads=2,
            in_chans=3,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=IMG,
        video_token_id=998,
        vision_start_token_id=VSTART,
        vision_end_token_id=VEND,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(cfg).double().train()


def make_batches(model):
    """Per rank: input_ids, labels, packed [4, 1, L] position ids, pixel_values, grid_thw."""
    rng = np.random.default_rng(1)
    out = []
    for samples in LAYOUT:
        ids, labels, pos, pix, grids = [], [], [], [], []
        for before, grid, after in samples:
            n_img = 0 if grid is None else int(np.prod(grid)) // 4
            seq = list(rng.integers(3, 900, before))
            if grid is not None:
                seq += [VSTART] + [IMG] * n_img + [VEND]
                pix.append(torch.from_numpy(rng.normal(size=(int(np.prod(grid)), 3 * 2 * 14 * 14))))
                grids.append(grid)
            seq += list(rng.integers(3, 900, after))
            t = torch.tensor(seq)[None]
            lab = t.clone()
            lab[0, 0] = -100  # a sample's first token is never a target
            lab[t == IMG] = -100
            mm = (t == IMG).int()
            g = torch.tensor([grid]) if grid is not None else None
            rope, _ = model.model.get_rope_index(t, mm, image_grid_thw=g)
            text = torch.arange(t.shape[1])[None, None]
            pos.append(torch.cat([text, rope], dim=0))
            ids.append(t)
            labels.append(lab)
        length = sum(x.shape[1] for x in ids)
        out.append(
            {
                "input_ids": torch.cat(ids, 1) if ids else torch.zeros(1, 0, dtype=torch.long),
                "labels": torch.cat(labels, 1) if labels else torch.zeros(1, 0, dtype=torch.long),
                "position_ids": torch.cat(pos, 2)
                if pos
                else torch.zeros(4, 1, length, dtype=torch.long),
                "pixel_values": torch.cat(pix).double() if pix else None,
                "image_grid_thw": torch.tensor(grids) if grids else None,
            }
        )
    return out


def _step(model, batch, num_items):
    out = model(**batch, num_items_in_batch=num_items, use_cache=False)  # packed: no KV cache
    out.loss.backward()
    return out.loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def rank_main(rank, world, mode):
    import torch.distributed as dist

    from trainer_adapter.hf_balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    model = build_model()
    batches = make_batches(model)
    policy = RedistributePolicy(enabled=mode == "balanced", placement="identity")
    balance_model(model, encoder=True, llm=True, policy=policy)
    batch = batches[rank]
    n = global_targets(batch["labels"])
    loss = _step(model, batch, n)
    dist.all_reduce(loss)
    grads = _grads(model)
    names = sorted(n for n, _ in model.named_parameters())
    flat = torch.cat(
        [
            grads.get(k, torch.zeros_like(dict(model.named_parameters())[k])).reshape(-1)
            for k in names
        ]
    )
    dist.all_reduce(flat)
    vision_route = model.model.visual.last_route
    llm_route = getattr(model.model.language_model, "last_route", None)
    return {
        "loss": float(loss),
        "grads": flat.numpy(),
        "names": names,
        "moved": (vision_route.moved, llm_route.moved if llm_route else 0),
        "loads": (llm_route.loads_before.tolist(), llm_route.loads_after.tolist())
        if llm_route
        else None,
    }


def reference():
    """One process, one packed row holding every rank's samples in rank order."""
    model = build_model()
    batches = make_batches(model)
    cat = {
        k: torch.cat([b[k] for b in batches], dim=-1 if k != "pixel_values" else 0)
        for k in ("input_ids", "labels", "position_ids")
    }
    cat["pixel_values"] = torch.cat(
        [b["pixel_values"] for b in batches if b["pixel_values"] is not None]
    )
    cat["image_grid_thw"] = torch.cat(
        [b["image_grid_thw"] for b in batches if b["image_grid_thw"] is not None]
    )
    n = int((cat["labels"][..., 1:] != -100).sum())
    loss = _step(model, cat, n)
    grads = _grads(model)
    names = sorted(n for n, _ in model.named_parameters())
    return float(loss), torch.cat([grads[k].reshape(-1) for k in names]).numpy(), grads


def test_qwen2vl_balanced_equals_unbalanced_equals_single_process():
    balanced = run_ranks(rank_main, 4, "balanced", timeout=300)
    plain = run_ranks(rank_main, 4, "plain", timeout=300)
    ref_loss, ref_grads, per_param = reference()
    for runs in (balanced, plain):
        for r in runs:  # every rank holds the same reduced loss and gradients
            # HF's causal-LM loss runs in float32 (it upcasts the logits): float32 tolerance
            assert r["loss"] == pytest.approx(ref_loss, rel=1e-6)
            np.testing.assert_allclose(r["grads"], ref_grads, rtol=1e-5, atol=1e-9)
    # the vision tower and its merger really learn (the gradient reaches the patches' path)
    for name in ("model.visual.patch_embed.proj.weight", "model.visual.merger.mlp.2.weight"):
        assert per_param[name].abs().sum() > 0
    # samples and images moved, and the LLM loads evened out
    assert balanced[0]["moved"][0] > 0 and balanced[0]["moved"][1] > 0
    assert plain[0]["moved"] == (0, 0)
    before, after = balanced[0]["loads"]
    assert max(after) < max(before)
