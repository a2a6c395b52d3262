"""HFPacker against the model's own processor: for each family, the packed row's tokens of every
sample equal ``processor(text=apply_chat_template(...), images=...)``'s, the pixel values are the
image processor's, labels cover exactly the assistant's text, positions restart per sample."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from shards.read.prep_settings import SettingsMismatch
from tests.dataprep.test_jinja_template import (
    FAMILIES,
    VARIANTS,
    conversations,
    make_model_dir,
    processor_for,
    processor_images,
    reference_messages,
    template_spec,
)
from tests.sweeps import sweep

pytest.importorskip("transformers")


def _vision_token_ids(tok) -> dict:
    """A Qwen config's ids of its vision tokens, from the tokenizer."""
    return {
        k: tok.convert_tokens_to_ids(t)
        for k, t in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }


def _rope_index(family, processor):
    """A tiny Qwen2-VL's / GLM-4.1V's / ERNIE 4.5-VL's ``get_rope_index``, with the tokenizer's
    ids for its vision tokens."""
    if family not in ("qwen2vl", "glm4v", "ernie45vl"):
        return None
    import transformers as tf

    tok = processor.tokenizer
    text = dict(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    if family == "ernie45vl":
        ids = tok.convert_tokens_to_ids
        cfg = tf.Ernie4_5_VLMoeConfig(
            text_config={
                **text,
                "moe_intermediate_size": [16, 16],
                "moe_num_experts": 2,
                "moe_k": 1,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "mrope_section": [2, 1, 1],
                },
            },
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2),
            image_token_id=ids("<|IMAGE_PLACEHOLDER|>"),
            image_start_token_id=ids("<|IMAGE_START|>"),
            image_end_token_id=ids("<|IMAGE_END|>"),
            video_token_id=ids("<|VIDEO_PLACEHOLDER|>"),
            video_start_token_id=ids("<|VIDEO_START|>"),
            video_end_token_id=ids("<|VIDEO_END|>"),
        )
        return tf.Ernie4_5_VLMoeModel(cfg).get_rope_index
    if family == "glm4v":
        ids = tok.convert_tokens_to_ids
        cfg = tf.Glm4vConfig(
            text_config={
                **text,
                "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1]},
            },
            vision_config=dict(depth=1, hidden_size=16, num_heads=2, out_hidden_size=16),
            image_token_id=ids("<|image|>"),
            video_token_id=ids("<|video|>"),
            image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"),
        )
        return tf.Glm4vModel(cfg).get_rope_index
    cfg = tf.Qwen2VLConfig(
        text_config=dict(**text, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2),
        **_vision_token_ids(tok),
    )
    return tf.Qwen2VLModel(cfg).get_rope_index


def _samples(root, records):
    """The records as the loader hands them to a transform: turns and encoded image bytes."""
    from dataprep.records import normalize_record

    return [
        SimpleNamespace(
            meta={"turns": normalize_record(r, r["id"]).turns},
            images=[(root / name).read_bytes() for name in r["image"]],
        )
        for r in records
    ]


# families whose templates have generation blocks: labels against transformers' assistant mask
# (the image tokens, which the tokenizer alone does not expand, left out of both)
MASKED = {
    "llava": ["<image>"],
    "llava_next": ["<image>"],
    "mistral3": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    "ernie45vl": ["<|IMAGE_PLACEHOLDER|>"],
}


@pytest.mark.parametrize(
    "family",
    sweep(
        "packer equals the processor",
        [*FAMILIES, *VARIANTS],
        fast=("internvl", "llava_next", "gemma3-pan-and-scan", "glm4v", "ernie45vl", "janus"),
    ),
)
def test_packer_matches_the_processor(family, tmp_path, tokenizer_path):
    from transformers.image_utils import load_image

    from trainer_adapter.hf.inputs import HFPacker

    call, _ = VARIANTS.get(family, ({}, None))  # the processor call's settings
    family = family.split("-")[0]
    model = make_model_dir(tmp_path, family, tokenizer_path)
    processor = processor_for(family, model)
    rope = _rope_index(family, processor)
    packer = HFPacker(
        family=family,
        processor=processor,
        template=template_spec(model, family),
        rope_index=rope,
        packing_kwargs=True,
        images_kwargs=call,
    )
    # SmolVLM: every image upscaled to 1536 px and cut into up to 17 tiles, so fewer samples
    records = conversations(tmp_path, 8 if family in ("smolvlm", "granite_docling") else 16, seed=7)
    samples = _samples(tmp_path, records)
    row = packer(samples)
    text_pos = row["position_ids"][0].reshape(-1)
    starts = [*(text_pos == 0).nonzero().reshape(-1).tolist(), text_pos.numel()]
    assert len(starts) - 1 == len(records)  # one restart per sample
    tok = processor.tokenizer
    pixels, sizes, counts, features, masks = [], [], [], [], []
    given = set()  # every input the processor gives for these samples
    for k, rec in enumerate(records):
        a, b = starts[k], starts[k + 1]
        text = processor.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [load_image(str(tmp_path / n)) for n in rec["image"]]  # EXIF turns applied
        want = processor(
            text=[text], images=processor_images(family, images), return_tensors="pt", **call
        )
        assert row["input_ids"][0, a:b].tolist() == want["input_ids"][0].tolist(), rec["id"]
        given |= set(want)
        if family == "gemma3":  # its processor marks image tokens for the bidirectional mask
            got_types = row["token_type_ids"][0, a:b].tolist()
            assert got_types == want["token_type_ids"][0].tolist(), rec["id"]
        if family == "gemma4":  # the modality of each token: its vision layers' mask reads it
            got_types = row["mm_token_type_ids"][0, a:b].tolist()
            assert got_types == want["mm_token_type_ids"][0].tolist(), rec["id"]
            assert sum(got_types) > 0 or not images
        if family == "ernie45vl":  # image tokens and their start / end: the vision experts'
            got_types = row["moe_mm_token_type_ids"][0, a:b].tolist()
            assert got_types == want["moe_mm_token_type_ids"][0].tolist(), rec["id"]
            assert sum(got_types) > 0 or not images
        if rope is not None:  # 3-D positions: the model's, from the processor's token types
            ref, _ = rope(
                want["input_ids"],
                want["mm_token_type_ids"],
                image_grid_thw=want.get("image_grid_thw"),
            )
            assert torch.equal(row["position_ids"][1:, :, a:b], ref), rec["id"]
        features.append({"input_ids": want["input_ids"][0].tolist()})
        if images and family == "llava_onevision":  # each image's tiles, none padded
            pix = want["pixel_values"]
            assert pix.shape[0] == 1 or pix.shape[1] == 1
            pixels.append(pix.reshape(-1, *pix.shape[2:]))
            sizes.append(want["image_sizes"])
            counts.append(len(images))
        elif images and family == "llava_next":  # each image's own tiles, its padding cut
            from transformers.models.llava_next.modeling_llava_next import (
                image_size_to_num_patches,
            )

            pinpoints = processor.image_processor.image_grid_pinpoints
            for pix, size in zip(want["pixel_values"], want["image_sizes"].tolist(), strict=True):
                n = image_size_to_num_patches(
                    image_size=tuple(size), grid_pinpoints=pinpoints, patch_size=336
                )
                pixels.append(pix[:n])
            sizes.append(want["image_sizes"])
        elif images and family == "mistral3":  # each image as resized, without its padding
            for pix, (h, w) in zip(want["pixel_values"], want["image_sizes"].tolist(), strict=True):
                pixels.append(pix[:, :h, :w])
            sizes.append(want["image_sizes"])
        elif images:
            pixels.append(want["pixel_values"])
            beside = ("pixel_attention_mask", "image_position_ids", "pixel_mask")
            for key in (*beside, "high_res_pixel_values"):
                masks += [want[key]] if key in want else []
        # the labelled tokens are the assistant's turns, in order
        got = tok.decode(row["input_ids"][0, a:b][row["labels"][0, a:b] != -100])
        answers = [t["value"] for t in rec["conversations"] if t["from"] == "gpt"]
        # LLaVA's template has generation blocks: transformers' own mask (LLaVA-OneVision's
        # too, but its answers end where a character's byte tokens end, and transformers'
        # mask marks one token per character: compared as text like the others)
        if family in MASKED:  # LLaVA-NeXT's and Mistral 3's: the eos trained too
            ref = tok.apply_chat_template(
                reference_messages(rec),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            image_ids = torch.tensor(tok.convert_tokens_to_ids(MASKED[family]))
            keep = [i for i, t in enumerate(ref["input_ids"]) if t not in image_ids]
            want_mask = [bool(ref["assistant_masks"][i]) for i in keep]
            ours = row["input_ids"][0, a:b]
            mask = (row["labels"][0, a:b] != -100)[~torch.isin(ours, image_ids)].tolist()
            want_mask[0] = False  # the packer never trains a sample's first token
            assert mask == want_mask, rec["id"]
        else:
            assert "".join(got.split()) == "".join("".join(answers).split()), rec["id"]
    if call:  # the call's setting changed what the processor made of the images
        n_images = sum(len(r["image"]) for r in records)
        assert row["pixel_values"].shape[0] > n_images + len(records) // 4
    tiles_dim = 1 if family in ("smolvlm", "granite_docling") else 0  # [1, tiles, C, H, W]
    if family == "mistral3":  # every image padded with zeros to the row's largest
        h, w = (max(p.shape[k] for p in pixels) for k in (1, 2))
        pixels = [
            torch.nn.functional.pad(p, (0, w - p.shape[2], 0, h - p.shape[1])) for p in pixels
        ]
        pixels = [p[None] for p in pixels]
        assert len({p.shape for p in pixels}) == 1 and len(pixels) > 10
    if family == "idefics2":  # every crop padded with zeros to the row's largest, its mask too
        h, w = (max(p.shape[k] for p in pixels) for k in (-2, -1))
        pad = lambda p: torch.nn.functional.pad(p, (0, w - p.shape[-1], 0, h - p.shape[-2]))  # noqa: E731
        pixels, masks = [pad(p) for p in pixels], [pad(m) for m in masks]
        assert sum(p.shape[1] for p in pixels) > 10
        assert torch.equal(row["pixel_attention_mask"], torch.cat(masks, 1))
        assert not row["pixel_attention_mask"].all()
        tiles_dim = 1  # [1, crops, C, H, W]
    assert torch.equal(row["pixel_values"], torch.cat(pixels, tiles_dim))
    if family in ("smolvlm", "granite_docling"):  # each tile's mask with it
        assert torch.equal(row["pixel_attention_mask"], torch.cat(masks, 1))
    if family == "deepseek_vl_hybrid":  # each image's 1024-px copy for its SAM tower
        assert torch.equal(row["high_res_pixel_values"], torch.cat(masks))
        assert row["high_res_pixel_values"].shape[-1] == 1024 and len(masks) > 6
    if family == "aria":  # each crop's pixel mask with it, its padding off
        assert torch.equal(row["pixel_mask"], torch.cat(masks))
        assert not row["pixel_mask"].all() and len(masks) > 6
    if family == "gemma4":  # each image's patch positions with it, -1 on its padding rows
        assert torch.equal(row["image_position_ids"], torch.cat(masks))
        assert (row["image_position_ids"] == -1).any() and len(masks) > 6
        assert len(pixels) > 6 and row["pixel_values"].shape[1] > 4 * len(pixels)
    # the row holds the processor's inputs (none it keeps to itself, as Ovis2's grids) besides
    # the labels, the packed positions and HF's packing kwargs (the mask: 1 everywhere)
    from trainer_adapter.hf.packing import PACKING_KEYS

    extra = set(row) - given - {"labels", "position_ids", *PACKING_KEYS}
    assert not extra and "attention_mask" not in row, extra
    # HF's packing kwargs as its flattening collator gives them for these samples
    from transformers import DataCollatorWithFlattening

    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    flat = flat(features, return_tensors="pt")
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"):
        got, want = row[key], flat[key]
        assert type(got) is type(want), key
        if torch.is_tensor(want):
            assert got.dtype == want.dtype and got.tolist() == want.tolist(), key
        else:
            assert got == want, key
    if family in ("llava_next", "llava_onevision", "mistral3"):
        assert torch.equal(row["image_sizes"], torch.cat(sizes))
    if family == "llava_onevision":
        assert row["batch_num_images"] == counts and max(counts) > 1 and min(counts) == 1


@pytest.mark.parametrize("model", ["qwen3vl", "qwen35"])
def test_qwen3vl_packer_matches_its_processor(model, tmp_path, tokenizer_path):
    """Qwen3-VL: 16-px patches (its image processor's), the Qwen chat template and vision
    tokens, 3-D positions from a tiny Qwen3-VL's ``get_rope_index``; tokens, pixels and grids
    equal ``Qwen3VLProcessor``'s, positions equal ``get_rope_index`` over each whole sample.
    Qwen3.5 ships ``Qwen3VLProcessor`` too: the same family with Qwen3.5's ``get_rope_index``
    (and the packing kwargs its linear-attention layers need)."""
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "Qwen3VLProcessor"):
        pytest.skip(f"transformers {tf.__version__} has no Qwen3-VL")
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from trainer_adapter.hf.inputs import HFPacker

    model_dir = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)  # Qwen's template, tokens
    qwen2 = processor_for("qwen2vl", model_dir)
    processor = type(
        "Qwen3VLImagesOnly",
        (tf.Qwen3VLProcessor,),
        {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])},
    )(
        image_processor=Qwen2VLImageProcessorPil(
            patch_size=16, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ),
        tokenizer=qwen2.tokenizer,
        chat_template=qwen2.tokenizer.chat_template,
    )
    tok = processor.tokenizer
    ids = _vision_token_ids(tok)
    rope_cfg = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
    cfg = tf.Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            rope_parameters={**rope_cfg, "mrope_interleaved": True},
        ),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=16, num_heads=2, patch_size=16,
            spatial_merge_size=2, out_hidden_size=16, num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        **ids,
    )  # fmt: skip
    rope_index = tf.Qwen3VLModel(cfg).get_rope_index
    if model == "qwen35":
        from tests.trainer_adapter.test_hf_parity import qwen35_config

        cfg35 = qwen35_config(("linear_attention", "full_attention"))
        for key, value in ids.items():
            setattr(cfg35, key, value)
        rope_index = tf.Qwen3_5Model(cfg35).get_rope_index
    packer = HFPacker(
        family="qwen3vl",
        processor=processor,
        template=str(model_dir),
        rope_index=rope_index,
        packing_kwargs=model == "qwen35",
    )
    records = conversations(tmp_path, 12, seed=11)
    samples = _samples(tmp_path, records)
    row = packer(samples)
    assert row["position_ids"].shape[:2] == (4, 1)
    text_pos = row["position_ids"][0, 0]
    starts = [*(text_pos == 0).nonzero().reshape(-1).tolist(), text_pos.numel()]
    assert len(starts) - 1 == len(records)
    pixels, grids = [], []
    for k, rec in enumerate(records):
        a, b = starts[k], starts[k + 1]
        text = processor.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [load_image(str(tmp_path / n)) for n in rec["image"]]  # EXIF turns applied
        want = processor(text=[text], images=images or None, return_tensors="pt")
        assert row["input_ids"][0, a:b].tolist() == want["input_ids"][0].tolist(), rec["id"]
        grid = want.get("image_grid_thw")
        rope, _ = rope_index(
            want["input_ids"],
            (want["input_ids"] == ids["image_token_id"]).int(),
            image_grid_thw=grid,
        )
        assert torch.equal(row["position_ids"][1:, :, a:b], rope), rec["id"]
        if images:
            pixels.append(want["pixel_values"])
            grids.append(grid)
    assert torch.equal(row["pixel_values"], torch.cat(pixels))
    assert torch.equal(row["image_grid_thw"], torch.cat(grids))
    assert row["pixel_values"].shape[1] == 3 * 2 * 16 * 16  # Qwen3-VL's patch, not Qwen2-VL's
    if model == "qwen35":  # the boundaries its linear-attention layers need, as HF's collator
        from transformers import DataCollatorWithFlattening

        flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
        ids_of = [row["input_ids"][0, a:b].tolist() for a, b in itertools.pairwise(starts)]
        want = flat([{"input_ids": x} for x in ids_of], return_tensors="pt")
        assert row["cu_seq_lens_q"].tolist() == want["cu_seq_lens_q"].tolist()
        assert row["seq_idx"].tolist() == want["seq_idx"].tolist()


# an image processor attribute that the processor's call overrides with its own default
OVERRIDDEN = {
    "internvl": ("crop_to_patches", False),  # GotOcr2ImageProcessor's default; the call crops
    "aya_vision": ("crop_to_patches", False),
    "aria": ("split_image", True),  # the call: 980-px crops, no splitting
    "gemma3": ("do_pan_and_scan", True),  # the call: no pan-and-scan unless asked
}


@pytest.mark.parametrize("family", list(OVERRIDDEN))
def test_packer_takes_the_image_settings_of_the_processor_call(family, tmp_path, tokenizer_path):
    """The images are processed with what the processor's call passes its image processor (its
    class's ``images_kwargs`` over the image processor's own attributes), not the attributes
    alone: the packed rows equal the processor's call for an image processor whose attribute
    the call overrides, and ``images_kwargs`` names settings the image processor takes."""
    from transformers.image_utils import load_image

    from trainer_adapter.hf.inputs import HFPacker

    model = make_model_dir(tmp_path, family, tokenizer_path)
    processor = processor_for(family, model)
    name, value = OVERRIDDEN[family]
    setattr(processor.image_processor, name, value)
    if family == "gemma3":  # what the image processor would need to run pan-and-scan itself
        processor.image_processor.pan_and_scan_min_crop_size = 256
        processor.image_processor.pan_and_scan_max_num_crops = 4
        processor.image_processor.pan_and_scan_min_ratio_to_activate = 1.2
    packer = HFPacker(family=family, processor=processor, template=template_spec(model, family))
    records = conversations(tmp_path, 6, seed=3)
    for rec, sample in zip(records, _samples(tmp_path, records), strict=True):
        row = packer([sample])
        text = processor.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [load_image(str(tmp_path / n)) for n in rec["image"]]
        want = processor(text=[text], images=images or None, return_tensors="pt")
        assert row["input_ids"][0].tolist() == want["input_ids"][0].tolist(), rec["id"]
        if images:
            assert torch.equal(row["pixel_values"], want["pixel_values"]), rec["id"]
    with pytest.raises(ValueError, match=r"\['do_crop_everything'\] are not settings"):
        HFPacker(
            family=family,
            processor=processor,
            template=template_spec(model, family),
            images_kwargs={"do_crop_everything": True},
        )


# another pixel bound than the processor's: prep's costs differ from what the model sees
OTHER = {
    "qwen2vl": "qwen2vl:max_pixels=200704",
    "mistral3": "mistral3:longest_edge=700",
    "aya_vision": "aya-vision:max_tiles=4",
    "ernie45vl": "ernie45vl:max_pixels=200704",
    "gemma4": "gemma4:max_soft_tokens=70",
    "ovis2": "ovis2:max_tiles=2",
    "aria": "aria:max_image_size=490",
    "granite_docling": "granite-docling:max_tiles=4",
    "idefics2": "idefics2:split=1",
    "gemma3": "gemma3:pan_and_scan=1",
    "gemma3-pan-and-scan": "gemma3",
}


# families whose processor settings are checked against the policy when the packer is built:
# OTHER's policy refused there, naming the processor's value
REFUSED_AT_ONCE = {
    "qwen2vl": "max_pixels 1003520",
    "ernie45vl": r"max_pixels \d+",
    "aya_vision": "max_tiles 12",
    "ovis2": "max_tiles 12",
    "mistral3": r"longest_edge \d+",
    "aria": r"max_image_size \d+",
    "idefics2": "split False",
    "gemma3": "pan_and_scan (True|False)",
    "gemma4": "max_soft_tokens 280",
    "granite_docling": "max_tiles 32",
}


@pytest.mark.parametrize(
    "family",
    sweep(
        "packer checks prep's costs end to end",
        [*FAMILIES, *VARIANTS],
        fast=("ovis2", "gemma4", "llava", "deepseek_vl", "gemma3", "aya_vision"),
    ),
)
def test_packer_checks_prep_costs_end_to_end(family, tmp_path, tokenizer_path):
    """The whole path: prep with the model's template and vision policy, plan, write, read with
    the loader; with ``check_costs`` every sample's packed length equals the cost prep measured
    (all samples of both ranks), for every family. Prepped with another policy than the
    processor's, reading stops at the first sample whose length differs, naming it."""
    from balancing.plan import BalanceConfig, build_plan, write_plan
    from dataprep import read_cost_table
    from shards import GroupDataset, RankInfo
    from shards.write.writer import WriteConfig, write_generation
    from tests.dataprep.helpers import run, write_jsonl
    from tests.dataprep.test_jinja_template import FAMILIES as SPECS
    from trainer_adapter.hf.inputs import HFPacker

    other = OTHER.get(family)
    call, own = VARIANTS.get(family, ({}, None))
    family = family.split("-")[0]
    model = make_model_dir(tmp_path, family, tokenizer_path)
    processor = processor_for(family, model)
    records = conversations(tmp_path, 16, seed=11)
    src = write_jsonl(tmp_path / "data.jsonl", records)
    packer = HFPacker(
        family=family,
        processor=processor,
        template=template_spec(model, family),
        rope_index=_rope_index(family, processor),
        check_costs=True,
        images_kwargs=call,
    )
    for policy in filter(None, (own or SPECS[family]["policy"], other)):
        root = tmp_path / policy.replace(":", "_").replace("=", "_")
        run(
            root,
            [src],
            str(model / "tokenizer.json"),
            template=template_spec(model, family),
            vision_policy=policy,
        )
        cost = root / "out" / "cost.parquet"
        plan = root / "plan"
        write_plan(build_plan(read_cost_table(cost), BalanceConfig(dp=2, nodes=1, seed=0)), plan)
        gen = root / "gen"
        write_generation(WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(gen)))

        def read_all(rank: int, gen=gen) -> int:
            data = GroupDataset(gen, RankInfo(rank=rank, world_size=2), transform=packer)
            return sum(
                int((step["samples"]["position_ids"][0].reshape(-1) == 0).sum()) for step in data
            )

        settings = {"family": family, "rope_index": packer.rope_index, "images_kwargs": call}
        # refused when built from the generation: pixel bounds, tile counts the processor has
        if policy == other and family in REFUSED_AT_ONCE:
            with pytest.raises(SettingsMismatch, match=REFUSED_AT_ONCE[family] + r" \(processor\)"):
                HFPacker.from_generation(gen, processor, **settings)
        elif policy != other:  # from the generation: its template, costs checked by default
            built = HFPacker.from_generation(gen, processor, **settings)
            assert built.check_costs and built._template.describe() == packer._template.describe()
        if policy == other:
            with pytest.raises(ValueError, match=r"sample 'c\d+'.*prep counted"):
                read_all(0), read_all(1)
        else:
            assert read_all(0) + read_all(1) == len(records)


def test_a_processor_of_another_family_than_the_generation_is_refused():
    from trainer_adapter.hf.policy_check import FAMILY_POLICIES, check_processor_policy

    settings = {"min_pixels": 3136, "max_pixels": 50176, "patch_size": 14, "merge_size": 2}
    qwen = SimpleNamespace(family="qwen2vl", _setting=settings.get)
    check_processor_policy(qwen, {"spec": "qwen2vl:max_pixels=50176", **settings})
    with pytest.raises(SettingsMismatch, match=r"'internvl:max_tiles=6'.*qwen2vl"):
        check_processor_policy(qwen, {"spec": "internvl:max_tiles=6"})
    with pytest.raises(SettingsMismatch, match=r"min_pixels 3136 \(processor\) vs 784"):
        check_processor_policy(qwen, {"spec": "qwen2vl", **settings, "min_pixels": 784})
    from trainer_adapter.hf.inputs import FAMILIES as PACKER_FAMILIES

    assert set(FAMILY_POLICIES) == set(PACKER_FAMILIES)


@pytest.mark.parametrize(
    "processor, message",
    [
        ({"crop_to_patches": True, "min_patches": 1, "max_patches": 12}, None),
        ({"crop_to_patches": True, "min_patches": 1, "max_patches": 6}, "max_tiles 6"),
        ({"crop_to_patches": True, "min_patches": 2, "max_patches": 12}, "min_tiles 2"),
        ({"crop_to_patches": False, "min_patches": 1, "max_patches": 12}, "max_tiles 1"),
        ({"crop_to_patches": True, "min_patches": 1, "max_patches": 12, "h": 384}, "tile_size 384"),
    ],
)
def test_a_tilers_processor_is_checked_against_the_recorded_tiles(processor, message):
    """Bug: an InternVL (Aya Vision, Ovis2) processor that tiles otherwise than the policy prep
    used (fewer tiles, no cropping, another tile size) was found only at the first sample whose
    image it changes, possibly far into a run; it is refused when the packer is built."""
    from trainer_adapter.hf.policy_check import check_processor_policy

    settings = {**processor, "size": {"height": processor.get("h", 448), "width": 448}}
    packer = SimpleNamespace(family="internvl", _setting=settings.get)
    policy = {"spec": "internvl", "min_tiles": 1, "max_tiles": 12, "tile_size": 448}
    if message is None:
        check_processor_policy(packer, policy)
    else:
        with pytest.raises(SettingsMismatch, match=message + r" \(processor\) vs"):
            check_processor_policy(packer, policy)


def test_aria_split_counts_each_images_own_crops(tmp_path, tokenizer_path):
    """Aria with its image processor splitting: ``AriaProcessor`` writes every image of a call
    as many tokens as the call's image with the most crops, more than a tiny Aria makes
    features for (it refuses them); the packer gives each image its own crops' tokens, which the
    model takes, and which prep's ``aria:split=1`` counts."""
    import transformers as tf
    from PIL import Image
    from transformers.models.aria import AriaImageProcessorPil

    from dataprep.policies import parse_vision_policy
    from tests.conftest import write_image
    from trainer_adapter.hf.inputs import HFPacker

    model_dir = make_model_dir(tmp_path, "aria", tokenizer_path)
    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    ip = AriaImageProcessorPil(split_image=True, max_image_size=490)
    # 490-px crops of 35-px patches: 196 patches, 4 queries each
    proc = tf.AriaProcessor(
        image_processor=ip, tokenizer=tok, size_conversion={490: 4}, chat_template=tok.chat_template
    )
    sizes = ((2000, 500), (400, 400))
    paths = [tmp_path / f"{k}.png" for k in range(2)]
    for path, (w, h) in zip(paths, sizes, strict=True):
        write_image(path, w, h)
    turns = [("user", "<image>a<image>b"), ("assistant", "c")]
    kw = {"split_image": True, "max_image_size": 490}  # its call's defaults: 980, no split
    packer = HFPacker(family="aria", processor=proc, template=str(model_dir), images_kwargs=kw)
    sample = SimpleNamespace(meta={"turns": turns}, images=[p.read_bytes() for p in paths])
    row = packer([sample])
    policy = parse_vision_policy("aria:split=1,max_image_size=490")
    crops = [len(policy.image_cost(w, h).vit_seq_lens) for w, h in sizes]
    assert crops[0] > crops[1] and row["pixel_values"].shape[0] == sum(crops)
    img = tok.convert_tokens_to_ids("<|img|>")
    assert int((row["input_ids"] == img).sum()) == 4 * sum(crops)
    record = {"conversations": [{"from": "human", "value": "<image>a<image>b"},
                                {"from": "gpt", "value": "c"}]}  # fmt: skip
    text = proc.apply_chat_template(reference_messages(record), tokenize=False)
    images = [Image.open(p).convert("RGB") for p in paths]
    theirs = proc(text=[text], images=images, return_tensors="pt", **kw)
    assert int((theirs["input_ids"] == img).sum()) == 4 * len(crops) * max(crops)
    cfg = tf.AriaConfig(
        vision_config=dict(model_type="idefics3_vision", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=490,
                           patch_size=35),
        text_config=dict(model_type="aria_text", vocab_size=len(tok), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, moe_num_experts=2, moe_topk=1,
                         moe_intermediate_size=16, moe_num_shared_experts=1),
        image_token_id=img,
        projector_patch_to_query_dict={196: 4},
    )  # fmt: skip
    model = tf.AriaForConditionalGeneration(cfg).eval()
    keep = ("input_ids", "pixel_values", "pixel_mask")
    with torch.no_grad():
        model(**{k: row[k] for k in keep}, use_cache=False)  # its own crops' tokens: taken
        with pytest.raises(ValueError, match="do not match"):
            model(**{k: theirs[k] for k in keep}, use_cache=False)


def test_idefics2_split_crops_and_a_tiny_model(tmp_path, tokenizer_path):
    """Idefics2 with its image processor splitting: each image's four quarters and itself, the
    fake tokens between them joined, as ``Idefics2Processor`` writes them token for token and
    pads them; prep's ``idefics2:split=1`` counts the sample, and a tiny Idefics2 takes the row
    (its resampler makes as many features as the row has image tokens)."""
    import transformers as tf
    from transformers.image_utils import load_image
    from transformers.models.idefics2 import Idefics2ImageProcessorPil

    from dataprep.measure import with_image_text
    from dataprep.policies import parse_vision_policy
    from dataprep.records import IMAGE_PLACEHOLDER
    from dataprep.text_tokens import TokenCounter, TokenizerSpec
    from tests.conftest import write_image
    from trainer_adapter.hf.inputs import HFPacker

    model_dir = make_model_dir(tmp_path, "idefics2", tokenizer_path)
    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    ip = Idefics2ImageProcessorPil(
        do_image_splitting=True, size={"shortest_edge": 28, "longest_edge": 70}
    )
    proc = tf.Idefics2Processor(
        image_processor=ip, tokenizer=tok, image_seq_len=4, chat_template=tok.chat_template
    )
    sizes = ((200, 50), (31, 45), (90, 90))
    paths = [tmp_path / f"{k}.png" for k in range(3)]
    for path, (w, h) in zip(paths, sizes, strict=True):
        write_image(path, w, h)
    say = "<image><image>a photo\n<image>"
    turns = [("user", say), ("assistant", "a cat")]
    packer = HFPacker(family="idefics2", processor=proc, template=str(model_dir))
    row = packer([SimpleNamespace(meta={"turns": turns}, images=[p.read_bytes() for p in paths])])
    record = {"conversations": [{"from": "human", "value": say}, {"from": "gpt", "value": "a cat"}]}
    text = proc.apply_chat_template(reference_messages(record), tokenize=False)
    theirs = proc(text=[text], images=[[load_image(str(p)) for p in paths]], return_tensors="pt")
    assert row["input_ids"].tolist() == theirs["input_ids"].tolist()
    assert torch.equal(row["pixel_values"], theirs["pixel_values"])
    assert torch.equal(row["pixel_attention_mask"], theirs["pixel_attention_mask"])
    assert row["pixel_values"].shape[1] == 15
    # prep's count of the sample, the same split
    policy = parse_vision_policy(
        "idefics2:split=1,shortest_edge=28,longest_edge=70,tokens_per_image=4"
    )
    costs = [policy.image_cost(w, h) for w, h in sizes]
    prompt = packer._template.render([("user", say.replace("<image>", IMAGE_PLACEHOLDER)),
                                      ("assistant", "a cat")])  # fmt: skip
    counted = TokenCounter(TokenizerSpec.parse(str(model_dir / "tokenizer.json"))).count(
        [policy.prompt(with_image_text(prompt, costs))]
    )[0]
    assert counted + sum(c.llm_tokens for c in costs) == row["input_ids"].shape[1]
    cfg = tf.Idefics2Config(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=70, patch_size=7),
        perceiver_config=dict(hidden_size=32, resampler_n_latents=4, resampler_depth=1,
                              resampler_n_heads=2, resampler_head_dim=8, num_key_value_heads=2),
        text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    model = tf.Idefics2ForConditionalGeneration(cfg).eval()
    keep = ("input_ids", "pixel_values", "pixel_attention_mask")
    with torch.no_grad():
        out = model(**{k: row[k] for k in keep}, use_cache=False)
    image_tokens = int((row["input_ids"] == cfg.image_token_id).sum())
    # the resampled features (transformers 5.24 moved them to image_outputs, one block a row)
    pooled = getattr(getattr(out, "image_outputs", None), "pooler_output", None)
    features = out.image_hidden_states if pooled is None else torch.cat(list(pooled))
    assert features.shape[0] == 15 * 4 == image_tokens


def test_granite_docling_fine_route_and_spread_rule(tmp_path, tokenizer_path):
    """Granite Docling on the fine connector path: four times the tokens a tile, as
    ``GraniteDoclingProcessor`` writes them token for token and prep's ``fine=1`` counts them,
    with one ``tile_fine_mask`` for the row. With the spread rule on (``dense_max_patches``),
    wide under-resolved pages take more tiles, the rows equal the processor's and prep's
    ``dense_*`` options count them."""
    import transformers as tf
    from transformers.image_utils import load_image
    from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

    from dataprep.policies import parse_vision_policy
    from trainer_adapter.hf.inputs import HFPacker

    model = make_model_dir(tmp_path, "granite_docling", tokenizer_path)
    tok = tf.AutoTokenizer.from_pretrained(str(model))
    proc = tf.GraniteDoclingProcessor(
        image_processor=GraniteDoclingImageProcessorPil(fine_route=True),
        tokenizer=tok,
        image_seq_len=64,
        chat_template=tok.chat_template,
    )
    records = [r for r in conversations(tmp_path, 12, seed=5) if r["image"]][:4]
    row = HFPacker(family="granite_docling", processor=proc, template=str(model))(
        _samples(tmp_path, records)
    )
    starts = [
        *(row["position_ids"][0] == 0).nonzero().reshape(-1).tolist(),
        row["input_ids"].shape[1],
    ]
    policy = parse_vision_policy("granite-docling:fine=1")
    image_id = tok.convert_tokens_to_ids("<image>")
    for k, rec in enumerate(records):
        text = proc.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [load_image(str(tmp_path / n)) for n in rec["image"]]
        want = proc(text=[text], images=images, return_tensors="pt")
        got = row["input_ids"][0, starts[k] : starts[k + 1]]
        assert got.tolist() == want["input_ids"][0].tolist(), rec["id"]
        sizes = [(im.width, im.height) for im in images]
        tokens = sum(policy.image_cost(w, h).llm_tokens for w, h in sizes)
        assert int((got == image_id).sum()) == tokens and want["tile_fine_mask"].all()
    assert row["tile_fine_mask"].tolist() == [True]
    from tests.conftest import write_image

    rule = {"dense_max_patches": 64, "dense_max_scale": 0.8, "dense_min_aspect": 1.5}
    dense = tf.GraniteDoclingProcessor(
        image_processor=GraniteDoclingImageProcessorPil(**rule),
        tokenizer=tok,
        image_seq_len=64,
        chat_template=tok.chat_template,
    )
    policy = parse_vision_policy(
        "granite-docling:dense_max_tiles=64,dense_max_scale=0.8,dense_min_aspect=1.5"
    )
    plain = parse_vision_policy("granite-docling")
    packer = HFPacker(family="granite_docling", processor=dense, template=str(model))
    # a wide page the rule selects (9 x 2 tiles at most 32, 14 x 3 with 64), one too narrow
    for w, h in ((6000, 1300), (1200, 1000)):
        path = write_image(tmp_path / f"page{w}.png", w, h)
        record = {"conversations": [{"from": "human", "value": "<image>read"},
                                    {"from": "gpt", "value": "ok"}]}  # fmt: skip
        sample = SimpleNamespace(
            meta={"turns": [("user", "<image>read"), ("assistant", "ok")]},
            images=[path.read_bytes()],
        )
        got = packer([sample])
        text = dense.apply_chat_template(reference_messages(record), tokenize=False)
        want = dense(text=[text], images=[load_image(str(path))], return_tensors="pt")
        assert got["input_ids"][0].tolist() == want["input_ids"][0].tolist(), (w, h)
        tiles = len(policy.image_cost(w, h).vit_seq_lens)
        assert got["pixel_values"].shape[1] == tiles == int(want["pixel_attention_mask"].sum())
        assert int((got["input_ids"] == image_id).sum()) == 64 * tiles
        assert (tiles > len(plain.image_cost(w, h).vit_seq_lens)) == (w > 2 * h)


def test_vipllava_takes_the_llava_rows(tmp_path, tokenizer_path):
    """VipLLaVA's checkpoints ship ``LlavaProcessor`` (CLIP 336 / 14, 576 tokens an image): the
    ``llava`` family's rows, which prep's ``fixed:336/14`` counts, go into a tiny VipLLaVA (its
    projector over several CLIP layers makes one feature per image token) and train."""
    import transformers as tf

    from trainer_adapter.hf.inputs import HFPacker

    model_dir = make_model_dir(tmp_path, "llava", tokenizer_path)
    processor = processor_for("llava", model_dir)
    packer = HFPacker(
        family="llava", processor=processor, template=template_spec(model_dir, "llava")
    )
    records = conversations(tmp_path, 4, seed=5)
    row = packer(_samples(tmp_path, records))
    tok = processor.tokenizer
    image = tok.convert_tokens_to_ids("<image>")
    n_images = sum(len(r["image"]) for r in records)
    assert n_images > 1 and int((row["input_ids"] == image).sum()) == 576 * n_images
    cfg = tf.VipLlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=3, num_attention_heads=2, image_size=336,
                           patch_size=14),
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2),
        image_token_index=image,
        vision_feature_layers=[-3, -1],
    )  # fmt: skip
    model = tf.VipLlavaForConditionalGeneration(cfg)
    keep = ("input_ids", "labels", "position_ids", "pixel_values")
    out = model(**{k: row[k] for k in keep}, use_cache=False)
    assert out.image_hidden_states.shape[:2] == (n_images, 576)
    out.loss.backward()
    assert model.model.multi_modal_projector.linear_1.weight.grad.abs().sum() > 0
