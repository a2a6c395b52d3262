"""``equishard train`` on a real generation with images, videos and recordings: every layout
computes the single-process gradient, the audio encoder's included (#67, item 3).

The generation (``tests.shards.media_generation``) is prepped with a Whisper-style rule of each
kind: ``padded`` (Qwen2-Audio's, each recording run as the whole window; Qwen2-VL images) and
``chunks`` (Qwen2.5-Omni's; InternVL images and videos, each frame a tile of the vision
encoder). The run takes its audio encoder from what prep recorded (``with_audio``: the rule's
kind and window, the collator's mel bins), the collator builds the log-mel frames and the audio
tokens, and the reference is computed here with no process group: the global batch through the
model's modules in order (a video's frames through the vision encoder in the order their tokens
stand), next-token targets inside each sample, a summed cross entropy over the global number of
targets. Bugs named: an audio encoder of another kind or window than prep measured, recordings
dropped or sent to another sample's slots when samples move, an audio gradient not reduced over
the ranks, a rank without recordings (or a PP stage past the first) not joining the audio phase,
an empty batch without the audio keys.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.dist_helper import run_ranks
from tests.shards.media_generation import RULES, VIDEO_RULE, build_audio_generation

GROUPS = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
SPLIT = [GROUPS[:4], GROUPS[4:]]  # uneven: one replica reads four groups, the other two
RTOL = 2e-5


@pytest.fixture(scope="module", params=sorted(RULES))
def audio_generation(request, tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp(f"audiotrain-{request.param}")
    # the chunked one also has InternVL's videos: images, videos and recordings in one run
    video = VIDEO_RULE if request.param == "chunks" else None
    gen = build_audio_generation(root, RULES[request.param], tokenizer_path, video_rule=video)
    return request.param, str(gen)


def _setup(gen):
    from shards import open_generation
    from trainer_adapter import TrainConfig, VLMConfig
    from trainer_adapter.train.loop import build_collator, with_audio

    manifest = open_generation(gen)
    collate = build_collator(TrainConfig(shards=gen, dp=1), manifest)
    mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
    return manifest, collate, with_audio(mcfg, collate)


def _samples(manifest, groups):
    from shards import read_group

    index = manifest.group_index()
    out = []
    for key in groups:
        shard, g = index[key]
        out += read_group(manifest.path, shard, g)[0]
    return out


def _reference(gen):
    from shards.read.collate import normalize_patches
    from trainer_adapter.train.model import VisionLanguageModel

    manifest, collate, mcfg = _setup(gen)
    b = collate(_samples(manifest, GROUPS))
    torch.manual_seed(7)
    model = VisionLanguageModel(mcfg)
    img = model.encode_images(normalize_patches(b["patches"]), b["units_hw"])
    aud = model.audio(b["audio_features"], b["audio_lens"][:, 0].tolist())
    x = model.llm.embed(b["input_ids"], b["position_ids"], img, b["image_token_id"],
                        extra=[(aud, b["audio_token_id"])])  # fmt: skip
    logits = model.llm.logits(model.llm.forward_blocks(x, b["llm_lens"].tolist()))
    target = torch.full_like(b["labels"], -100)
    for a, z in itertools.pairwise(b["cu_seqlens"].tolist()):
        target[a : z - 1] = b["labels"][a + 1 : z]
    loss = F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")
    (loss / int((target != -100).sum())).backward()
    n = int((target != -100).sum())
    grads = {k: p.grad.detach().numpy() for k, p in model.named_parameters()}
    return float(loss.detach()) / n, grads, mcfg.audio


def _distributed(rank, world, gen, layouts):
    import torch.distributed as dist

    from trainer_adapter import TrainConfig, Trainer
    from trainer_adapter.train.trainer import empty_batch

    manifest, collate, mcfg = _setup(gen)
    lens = collate(_samples(manifest, GROUPS))["llm_lens"]
    results = []
    for dp, pp, redistribute in layouts:
        cfg = TrainConfig(
            shards=gen, dp=dp, pp=pp, steps=1, schedule="1f1b", microbatches=2 * pp,
            redistribute=redistribute, method="lpt", seed=7, partition_top_k=1,
        )  # fmt: skip
        mb = max(int(lens.max()), -(-int(0.8 * lens.sum()) // cfg.n_microbatches))
        trainer = Trainer(cfg, mcfg, mb_tokens=-(-mb // 16) * 16, ranks_per_node=world)
        if trainer.stage == 0:
            batch = collate(_samples(manifest, SPLIT[trainer.replica]))
        else:  # a later stage reads nothing, as the loop's empty batch
            a = mcfg.audio
            batch = empty_batch(mcfg.patch_dim, collate.image_token_id,
                                audio=(a.mel, collate.audio_token_id))  # fmt: skip
        out = trainer.forward_backward(batch)
        names = {id(p): n for n, p in trainer.model.named_parameters()}
        grads = {names[id(p)]: p.grad.detach().clone().numpy() for p in trainer.params}
        moved = out["route"]["bytes"].get("audio", {"intra_node": 0, "inter_node": 0})
        heard = trainer.timer.collect()["phases"].get("audio", {"items": []})["items"]
        results.append(
            {
                "loss": out["loss"],
                "grads": grads,
                "audio_moved": moved["intra_node"] + moved["inter_node"],
                "moved": sum(
                    v["intra_node"] + v["inter_node"] for v in out["route"]["bytes"].values()
                ),
                "heard": len(heard),
            }
        )
        dist.barrier()
    return results


def test_every_layout_gives_the_single_process_gradient_with_the_audio_encoder(audio_generation):
    kind, gen = audio_generation
    loss, grads, audio = _reference(gen)
    # the encoder prep measured: Qwen2-Audio's padded 2-s window, or Omni's chunks of 6 frames
    assert (audio.n_window, audio.window_frames, audio.mel) == (
        (0, 200, 128) if kind == "padded" else (3, 200, 128)
    )
    assert all(np.abs(grads[n]).max() > 0 for n in grads if n.startswith("audio."))
    layouts = {2: [(2, 1, True), (2, 1, False)], 4: [(2, 2, True)]}
    for world, runs in layouts.items():
        if world == 4 and kind == "padded":
            continue  # the pipeline's audio path is the same for both kinds
        per_rank = run_ranks(_distributed, world, gen, runs, timeout=300)
        for k, layout in enumerate(runs):
            covered: set[str] = set()
            for res in (r[k] for r in per_rank):
                assert res["loss"] == pytest.approx(loss, rel=1e-5), layout
                for name, g in res["grads"].items():
                    scale = float(np.abs(grads[name]).max())
                    assert float(np.abs(g - grads[name]).max()) <= RTOL * scale + 1e-8, (
                        layout,
                        name,
                    )
                covered |= set(res["grads"])
            assert covered == set(grads), layout
            moved = sum(r[k]["moved"] for r in per_rank)
            heard = sum(r[k]["audio_moved"] for r in per_rank)
            assert (moved > 0) == layout[2], (layout, moved)  # samples move when balanced
            # the chunk plan's replicas hold uneven recordings (the padded one's hold four
            # windows each: nothing to gain)
            assert (heard > 0) == (layout[2] and kind == "chunks"), (layout, heard)
            assert sum(r[k]["heard"] for r in per_rank) > 0
