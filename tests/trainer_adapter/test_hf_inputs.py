"""HFPacker against the model's own processor: for each family, the packed row's tokens of every
sample equal ``processor(text=apply_chat_template(...), images=...)``'s, the pixel values are the
image processor's, labels cover exactly the assistant's text, positions restart per sample."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.dataprep.test_jinja_template import (
    FAMILIES,
    conversations,
    make_model_dir,
    processor_for,
    reference_messages,
)

pytest.importorskip("transformers")


def _rope_index(family, processor):
    """A tiny Qwen2-VL's ``get_rope_index``, with the tokenizer's ids for its vision tokens."""
    if family != "qwen2vl":
        return None
    from transformers import Qwen2VLConfig, Qwen2VLModel

    tok = processor.tokenizer
    ids = {
        k: tok.convert_tokens_to_ids(t)
        for k, t in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2),
        **ids,
    )
    return Qwen2VLModel(cfg).get_rope_index


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packer_matches_the_processor(family, tmp_path, tokenizer_path):
    from PIL import Image

    from dataprep.records import normalize_record
    from trainer_adapter.hf_inputs import HFPacker

    model = make_model_dir(tmp_path, family, tokenizer_path)
    processor = processor_for(family, model)
    rope = _rope_index(family, processor)
    packer = HFPacker(family=family, processor=processor, template=str(model), rope_index=rope)
    records = conversations(tmp_path, 24, seed=7)
    samples = [
        SimpleNamespace(
            meta={"turns": normalize_record(r, r["id"]).turns},
            images=[(tmp_path / name).read_bytes() for name in r["image"]],
        )
        for r in records
    ]
    row = packer(samples)
    text_pos = row["position_ids"][0].reshape(-1)
    starts = [*(text_pos == 0).nonzero().reshape(-1).tolist(), text_pos.numel()]
    assert len(starts) - 1 == len(records)  # one restart per sample
    tok = processor.tokenizer
    pixels = []
    for k, rec in enumerate(records):
        a, b = starts[k], starts[k + 1]
        text = processor.apply_chat_template(reference_messages(rec), tokenize=False)
        images = [Image.open(tmp_path / n).convert("RGB") for n in rec["image"]]
        want = processor(text=[text], images=images or None, return_tensors="pt")
        assert row["input_ids"][0, a:b].tolist() == want["input_ids"][0].tolist(), rec["id"]
        if images:
            pixels.append(want["pixel_values"])
        # the labelled tokens are the assistant's turns, in order
        got = tok.decode(row["input_ids"][0, a:b][row["labels"][0, a:b] != -100])
        answers = [t["value"] for t in rec["conversations"] if t["from"] == "gpt"]
        if family == "llava":  # a template with generation blocks: transformers' own mask
            ref = tok.apply_chat_template(
                reference_messages(rec),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            image_id = tok.convert_tokens_to_ids("<image>")
            keep = [i for i, t in enumerate(ref["input_ids"]) if t != image_id]
            want_mask = [bool(ref["assistant_masks"][i]) for i in keep]
            ours = row["input_ids"][0, a:b]
            mask = (row["labels"][0, a:b] != -100)[ours != image_id].tolist()
            want_mask[0] = False  # the packer never trains a sample's first token
            assert mask == want_mask, rec["id"]
        else:
            assert "".join(got.split()) == "".join("".join(answers).split()), rec["id"]
    assert torch.equal(row["pixel_values"], torch.cat(pixels))
