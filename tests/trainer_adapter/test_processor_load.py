"""``load_processor``: a video-capable family's processor for image training on the README's
CPU install, where torchvision is absent.

The bug it catches (issue 70): the docs' loop called ``AutoProcessor.from_pretrained(MODEL)``,
which fails there ("Qwen2VLVideoProcessor requires the Torchvision library") before any image
is seen; the docs test hid it by patching transformers. The anchor is independent of the
function: the image processor and the tokenizer loaded on their own from the same folder give
the pixels and the ids (the image token expanded to ``grid / merge^2``) the loaded processor
must give.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, tokenizer_path) -> Path:
    """A tiny Qwen2-VL model folder: config, tokenizer with Qwen's tokens and template, image
    processor (what a downloaded checkpoint holds, without the weights)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_hf_vlm as ex
    finally:
        sys.path.remove(str(ROOT / "examples"))
    root = tmp_path_factory.mktemp("qwen")
    model = ex.model_dir("qwen2vl", tokenizer_path, root / "model")
    processor, net = ex.build("qwen2vl", model)
    processor.save_pretrained(model)
    net.config.save_pretrained(model)
    # what a released Qwen2-VL checkpoint ships beside its image processor's config
    (model / "video_preprocessor_config.json").write_text(
        json.dumps(
            {
                "video_processor_type": "Qwen2VLVideoProcessor",
                "min_pixels": 3136,
                "max_pixels": 50176,
                "patch_size": 14,
                "temporal_patch_size": 2,
                "merge_size": 2,
            }
        )
    )
    return model


def test_the_full_processor_needs_torchvision_the_loaded_one_does_not(qwen_dir):
    import transformers

    from trainer_adapter.hf.processor_load import load_processor

    if not HAS_TORCHVISION:  # the README's install: the bug as users met it
        with pytest.raises(ImportError, match=r"[Tt]orchvision"):
            transformers.AutoProcessor.from_pretrained(str(qwen_dir))
        with pytest.raises(ImportError, match=r"[Tt]orchvision"):
            load_processor(str(qwen_dir), video=True)  # video needs it: said, not hidden
    processor = load_processor(str(qwen_dir))
    assert type(processor).__name__ == "Qwen2VLProcessor"
    assert getattr(processor, "video_processor", None) is None


def test_the_loaded_processor_gives_the_image_processors_pixels_and_the_tokenizers_ids(qwen_dir):
    import transformers

    from trainer_adapter.hf.processor_load import load_processor

    processor = load_processor(str(qwen_dir))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (120, 90, 3), np.uint8))
    text = "<|vision_start|><|image_pad|><|vision_end|>What is it?"
    got = processor(text=[text], images=[image], return_tensors="np")
    # the reference: the folder's image processor and tokenizer, each loaded alone
    images = transformers.AutoImageProcessor.from_pretrained(str(qwen_dir))
    ref = images(images=[image], return_tensors="np")
    np.testing.assert_array_equal(got["pixel_values"], ref["pixel_values"])
    np.testing.assert_array_equal(got["image_grid_thw"], ref["image_grid_thw"])
    n = int(np.prod(ref["image_grid_thw"][0])) // images.merge_size**2
    tok = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    expanded = text.replace("<|image_pad|>", "<|image_pad|>" * n)
    assert got["input_ids"][0].tolist() == tok(expanded, add_special_tokens=False)["input_ids"]


def test_a_model_type_without_a_processor_class_is_refused_naming_it(tmp_path):
    import transformers

    from trainer_adapter.hf.processor_load import load_processor

    transformers.GPT2Config(n_layer=1, n_head=1, n_embd=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no processor class for model type 'gpt2'"):
        load_processor(str(tmp_path))
