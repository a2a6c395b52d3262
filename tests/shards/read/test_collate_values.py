"""The collator's tensors, value by value, against references computed apart: the pixels against
CLIP's published normalization (transformers' ``OPENAI_CLIP_MEAN``/``STD``) of the same resize,
each sample's image tokens, labels, positions and boundaries against the policy's counts and the
tokenizer, and the per-sample unit counts against each sample's own images.

Planted bugs these catch (mutation testing of ``shards/read/collate.py``): a normalization
constant changed, a patch's values out of channel order, the raw bytes taken for normalized
pixels, a sample's image tokens labelled, its second image given the first's token count,
``cu_seqlens`` not starting at 0, a sample's unit count summed wrong, more ``<image>`` marks than
images accepted, the vocabulary counted without the image tokens, ``"uint8"`` compared by
identity."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from PIL import Image

from dataprep.policies import parse_vision_policy
from shards.read.collate import IMAGE_CONTEXT, Collator, normalize_patches
from shards.read.reader import ShardSample

SPECS = ["fixed:56/14", "internvl:max_tiles=4,tile_size=56,patch_size=14", "qwen2vl"]


def _png(w: int, h: int, seed: int) -> bytes:
    a = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def _sample(key: str, n_images: int, sizes=((120, 60), (60, 170))) -> ShardSample:
    marks = "<image>\n" * n_images
    turns = [["user", marks + "What is shown?"], ["assistant", "Two shapes."]]
    images = [_png(*sizes[i % len(sizes)], seed=i) for i in range(n_images)]
    return ShardSample(key, {"turns": turns, "sample_id": key}, images)


def _sizes(s: ShardSample) -> list[tuple[int, int]]:
    return [Image.open(io.BytesIO(b)).size for b in s.images]


def _reference_patches(data: bytes, size: tuple[int, int], p: int) -> np.ndarray:
    """The resize, CLIP's normalization and the row-major p x p patches (channels last), from
    transformers' published constants and numpy alone."""
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    img = Image.open(io.BytesIO(data)).convert("RGB").resize(size, Image.Resampling.BICUBIC)
    a = (np.asarray(img, dtype=np.float64) / 255.0 - OPENAI_CLIP_MEAN) / OPENAI_CLIP_STD
    rows, cols = size[1] // p, size[0] // p
    out = []
    for r in range(rows):
        for c in range(cols):
            out.append(a[r * p : (r + 1) * p, c * p : (c + 1) * p].reshape(-1))
    return np.stack(out)


def test_pixels_are_clips_normalization_of_the_resized_image(tokenizer_path):
    col = Collator(tokenizer=tokenizer_path, vision_policy="fixed:56/14", check_costs=False)
    s = _sample("a", 1)
    batch = col([s])
    want = _reference_patches(s.images[0], (56, 56), 14)
    assert batch["patches"].dtype == torch.float32 and batch["patches"].shape == want.shape
    np.testing.assert_allclose(batch["patches"].numpy(), want, rtol=0, atol=1e-5)
    # uint8 rows normalized on the device: the same values
    raw = Collator(tokenizer=tokenizer_path, vision_policy="fixed:56/14", pixels="uint8")
    rb = raw([s])["patches"]
    assert rb.dtype == torch.uint8
    np.testing.assert_allclose(normalize_patches(rb).numpy(), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_each_samples_tokens_labels_positions_and_units(tokenizer_path, spec):
    """Three samples (two images of different sizes, none, one): each image becomes exactly its
    own count of image tokens, never labelled; positions restart at every sample; cu_seqlens
    runs from 0 by the samples' lengths; num_units counts each sample's own encoder units."""
    col = Collator(tokenizer=tokenizer_path, vision_policy=spec, check_costs=False)
    policy = parse_vision_policy(spec)
    samples = [_sample("two", 2), _sample("none", 0), _sample("one", 1, sizes=((200, 90),))]
    batch = col(samples)
    ids, labels = batch["input_ids"].tolist(), batch["labels"].tolist()
    cu = batch["cu_seqlens"].tolist()
    assert cu[0] == 0 and np.diff(cu).tolist() == batch["llm_lens"].tolist() and cu[-1] == len(ids)
    img_id = col.image_token_id
    units_per_sample = []
    for k, s in enumerate(samples):
        lo, hi = cu[k], cu[k + 1]
        assert batch["position_ids"][lo:hi].tolist() == list(range(hi - lo))
        costs = policy.sample_costs(_sizes(s))
        # the image tokens in order ("<image>\n" apart): each run is exactly its image's count
        runs = []
        for i in range(lo, hi):
            if ids[i] == img_id:
                if i == lo or ids[i - 1] != img_id:
                    runs.append(0)
                runs[-1] += 1
        assert runs == [c.llm_tokens for c in costs], (spec, k)
        assert all(labels[i] == -100 for i in range(lo, hi) if ids[i] == img_id)
        assert batch["vit_lens"][k] == sum(c.vit_tokens for c in costs)
        units_per_sample.append(sum(len(c.vit_seq_lens) for c in costs))
    assert batch["num_units"].tolist() == units_per_sample
    assert len(batch["units_hw"]) == sum(units_per_sample)
    pcu = batch["patch_cu_seqlens"].tolist()
    assert pcu[0] == 0 and pcu[-1] == len(batch["patches"])
    assert np.diff(pcu).tolist() == batch["units_hw"].prod(dim=1).tolist()


def _runs(ids: list[int], token: int) -> list[int]:
    runs = []
    for i, t in enumerate(ids):
        if t == token and (i == 0 or ids[i - 1] != token):
            runs.append(0)
        if t == token:
            runs[-1] += 1
    return runs


def test_images_of_different_sizes_each_get_their_own_token_count(tokenizer_path):
    col = Collator(tokenizer=tokenizer_path, vision_policy="qwen2vl", check_costs=False)
    s = _sample("two", 2, sizes=((56, 56), (560, 280)))
    want = [parse_vision_policy("qwen2vl").image_cost(w, h).llm_tokens for w, h in _sizes(s)]
    assert want == [4, 200]  # 4x4 patches merged 2x2 to 4; 20x40 patches to 200
    assert _runs(col([s])["input_ids"].tolist(), col.image_token_id) == want


@pytest.mark.parametrize("marks,images", [(2, 1), (1, 2), (0, 1), (1, 0)])
def test_image_marks_and_images_must_match(tokenizer_path, marks, images):
    col = Collator(tokenizer=tokenizer_path, vision_policy="qwen2vl", check_costs=False)
    turns = [["user", "<image>\n" * marks + "What?"], ["assistant", "This."]]
    s = ShardSample(
        "k", {"turns": turns, "sample_id": "k"}, [_png(56, 56, i) for i in range(images)]
    )
    with pytest.raises(ValueError, match=f"sample 'k': {marks} <image> tokens for {images} images"):
        col([s])


def test_the_vocabulary_holds_the_image_tokens(tokenizer_path):
    """The model's embedding table must hold every id the collator emits: the tokenizer's
    own vocabulary and the image placeholder and context tokens it adds."""
    from tokenizers import Tokenizer

    from dataprep.records import IMAGE_PLACEHOLDER

    base = Tokenizer.from_file(tokenizer_path)
    assert base.token_to_id(IMAGE_CONTEXT) is None  # the context token is new
    new = sum(base.token_to_id(t) is None for t in (IMAGE_PLACEHOLDER, IMAGE_CONTEXT))
    col = Collator(tokenizer=tokenizer_path, vision_policy="qwen2vl")
    assert col.vocab_size == base.get_vocab_size(with_added_tokens=True) + new
    assert col.image_token_id == col.vocab_size - 1


def test_uint8_pixels_are_read_by_value_not_by_identity(tokenizer_path):
    """A setting read from a file or a command line is a new string, not the literal."""
    pixels = "".join(["uint", "8"])
    col = Collator(tokenizer=tokenizer_path, vision_policy="fixed:56/14", pixels=pixels)
    turns = [["user", "Hello"], ["assistant", "Hi."]]
    empty = col([ShardSample("t", {"turns": turns, "sample_id": "t"}, [])])["patches"]
    assert empty.dtype == torch.uint8 and empty.shape == (0, 3 * 14 * 14)
    assert col([_sample("a", 1)])["patches"].dtype == torch.uint8  # an image's rows too
    normalized = Collator(tokenizer=tokenizer_path, vision_policy="fixed:56/14")
    turns_batch = normalized([ShardSample("t", {"turns": turns, "sample_id": "t"}, [])])
    assert turns_batch["patches"].dtype == torch.float32


def _llama_like(tokenizer_path, tmp_path) -> str:
    """The demo tokenizer as a large model's is: ``<image>`` not in it (the collator adds it,
    at an id past 256) and a post-processor that puts a BOS before every encoding."""
    import json
    from pathlib import Path

    from tests.conftest import bos_post_processor

    t = json.loads(Path(tokenizer_path).read_text())
    t["added_tokens"] = [a for a in t["added_tokens"] if a["content"] != "<image>"]
    t["model"]["vocab"].pop("<image>", None)
    t["post_processor"] = bos_post_processor("<|endoftext|>", 0)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(t))
    return str(path)


def test_a_tokenizer_with_a_bos_and_a_new_image_token(tokenizer_path, tmp_path):
    """Prep counts without the tokenizer's special tokens (no BOS), and a large vocabulary puts
    the added ``<image>`` far past the small integers: each image still becomes its tokens, and
    no BOS is added."""
    from tokenizers import Tokenizer

    path = _llama_like(tokenizer_path, tmp_path)
    col = Collator(tokenizer=path, vision_policy="qwen2vl", check_costs=False)
    assert col._mark_ids["<image>"] > 256
    s = _sample("two", 2, sizes=((56, 56), (560, 280)))
    batch = col([s])
    ids = batch["input_ids"].tolist()
    assert ids[0] != 0  # no BOS
    assert _runs(ids, col.image_token_id) == [4, 200]
    text = col._tmpl.render_spans([tuple(t) for t in s.meta["turns"]])[0]
    plain = Tokenizer.from_file(path)
    assert plain.encode(text).ids[0] == 0  # the tokenizer itself would add it


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_sample_whose_prep_count_differs_either_way_is_refused(tokenizer_path, delta):
    col = Collator(tokenizer=tokenizer_path, vision_policy="qwen2vl")
    s = _sample("one", 1, sizes=((56, 56),))
    built = int(
        Collator(tokenizer=tokenizer_path, vision_policy="qwen2vl", check_costs=False)([s])[
            "llm_lens"
        ][0]
    )
    s.meta["cost"] = {"llm_tokens": built + delta}
    with pytest.raises(
        ValueError, match=f"makes {built} llm_tokens of it, prep counted {built + delta}"
    ):
        col([s])
    s.meta["cost"] = {"llm_tokens": built}
    assert int(col([s])["llm_lens"][0]) == built


def test_the_collator_is_a_frozen_keyword_only_value(tokenizer_path):
    import dataclasses

    with pytest.raises(TypeError):
        Collator(tokenizer_path)
    col = Collator(tokenizer=tokenizer_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        col.pixels = "uint8"
    with pytest.raises(TypeError):
        Collator.from_generation("gen", tokenizer_path)  # settings by keyword only


@pytest.mark.parametrize(
    ("videos", "audios", "said"),
    [(1, 0, "1 video(s)"), (0, 2, "2 recording(s)"), (1, 1, "1 video(s) and 1 recording(s)")],
)
def test_a_sample_with_videos_or_recordings_is_refused_not_counted_as_text(
    tokenizer_path, videos, audios, said
):
    """Its ``<video>``/``<audio>`` marks would be tokenized as text and its media dropped:
    the sample would train as something else than it is. An image sample beside it passes."""
    c = Collator(tokenizer=tokenizer_path, vision_policy=SPECS[0])
    ok = _sample("ok", 1)
    bad = ShardSample(
        "media",
        {"turns": [["user", "<audio>\nWhat is said?"], ["assistant", "Hello."]], "sample_id": "m"},
        [],
        videos=[b"v"] * videos,
        audios=[b"a"] * audios,
    )
    c([ok])
    with pytest.raises(ValueError, match=re.escape(f"sample 'm' has {said}: equishard's own")):
        c([ok, bad])
