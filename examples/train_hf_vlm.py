"""Train a tiny Hugging Face VLM on an equishard generation with runtime balancing, in a plain
PyTorch DDP loop (``--parallel fsdp2``: FSDP2, ``fully_shard`` per block). Run under torchrun (CPU: gloo;
GPU: NCCL):

    torchrun --nproc-per-node 4 examples/train_hf_vlm.py --shards build/train-demo/shards \\
        --tokenizer build/train-demo/raw/tokenizer.json --family qwen2vl --balance both

``--family`` qwen2vl | qwen25vl | qwen3vl | glm4v | internvl | llava | llava_next | llava_onevision | gemma3 |
gemma4 | smolvlm | mistral3 | aya_vision | ernie45vl | deepseek_vl | deepseek_vl_hybrid | janus |
ovis2 | aria | granite_docling | idefics2 | qwen2_5_omni (Qwen2.5-Omni's thinker: images and
recordings, its audio tower balanced as a phase of its own) builds a tiny model of that architecture from its
``transformers`` config (random weights, nothing downloaded), the family's processor classes
from config, and a local tokenizer (the given tokenizer.json with the family's special tokens).
``--balance`` off | encoder | llm | both. Each step logs, per rank, the encoder and LLM loads
before/after balancing with their max/mean ratios, and the step time (JSON lines in
``--jsonl``); rank 0 prints a summary. A phase not balanced (both under ``off``) is measured
all the same: its loads, and the max/mean balancing would have given (``*_planned``), from a
dry run of the plan that moves nothing (``--no-measure``: the plain baseline, not wrapped).
The lines marked "equishard" are all a loop needs to turn balancing on.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shards import GroupDataset, RankInfo
from trainer_adapter import RedistributePolicy
from trainer_adapter.hf.balance import balance_model, global_targets  # equishard
from trainer_adapter.hf.inputs import HFPacker  # equishard

TEMPLATES = Path(__file__).resolve().parent / "chat_templates"
_QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<|endoftext|>"]  # fmt: skip
SPECIALS = {
    "qwen2vl": _QWEN_SPECIALS,
    "qwen25vl": _QWEN_SPECIALS,
    "qwen3vl": _QWEN_SPECIALS,
    "glm4v": ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|endoftext|>",
              "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>",
              "<|end_of_video|>", "<|video|>"],
    "internvl": ["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"],
    "llava": ["<s>", "</s>", "<image>"],
    "llava_next": ["<s>", "</s>", "<image>"],
    "mistral3": ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                 "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    "llava_onevision": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<image>", "<video>"],
    "smolvlm": ["<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
                "<global-img>", "<image>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]],
    "gemma3": ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>",
               "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
    "gemma4": ["<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|image>", "<image|>",
               "<|image|>", "<|audio>", "<audio|>", "<|audio|>"],
    "aya_vision": ["<PAD>", "<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                   "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<image>",
                   "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>"],
    "ernie45vl": ["<|begin_of_sentence|>", "<|end_of_sentence|>", "<unk>", "<|IMAGE_PLACEHOLDER|>",
                  "<|IMAGE_START|>", "<|IMAGE_END|>", "<|VIDEO_PLACEHOLDER|>", "<|VIDEO_START|>",
                  "<|VIDEO_END|>"],
    "deepseek_vl": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<image_placeholder>"],
    "deepseek_vl_hybrid": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<image_placeholder>"],
    "janus": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|User|>", "<|Assistant|>",
              "<image_placeholder>", "<begin_of_image>", "<end_of_image>"],
    "ovis2": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<IMG_ATOM>", "<IMG_START>",
              "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"],
    "aria": ["<|im_start|>", "<|im_end|>", "<pad>", "<fim_prefix>", "<fim_suffix>", "<|img|>"],
    "granite_docling": ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>",
                        "<fake_token_around_image>", "<global-img>", "<image>",
                        *[f"<row_{r}_col_{c}>" for r in range(1, 17) for c in range(1, 17)]],
    "idefics2": ["<s>", "</s>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"],
    "qwen2_5_omni": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_bos|>",
                     "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|audio_bos|>",
                     "<|audio_eos|>"],
}  # fmt: skip
FAMILIES = list(SPECIALS)
# the chat template file (examples/chat_templates/) a family's model ships when it is another's
TEMPLATE_FILE_OF = {
    "qwen25vl": "qwen2vl",
    "qwen3vl": "qwen2vl",
    "deepseek_vl_hybrid": "deepseek_vl",
}
# the HFPacker family of a model whose processor makes another family's rows (Qwen2.5-VL's:
# Qwen2-VL's patch rows, grids and tokens; its tower differs, window attention)
PACKER_OF = {"qwen25vl": "qwen2vl"}
DEEPSEEK_STYLE = ("deepseek_vl", "janus", "deepseek_vl_hybrid")  # the tiny SigLIP models below


def family_of(family: str):
    """equishard's spec of the family (dataprep/families/): its template image family, and how
    its rows are built (3-D rope positions for the Qwen-style ones)."""
    from dataprep.families.registry import family_spec

    return family_spec(PACKER_OF.get(family, family))


def template_arg(family: str, mdir: Path) -> str:
    """``--template`` for the family's model folder, naming its template image family from the
    spec (``#images=``: DeepSeek-VL's and Janus's templates write the same marker; naming it is
    taken for every family)."""
    return f"{mdir}#images={family_of(family).template}"


TILE = 56  # px per tile for the tiny InternVL / LLaVA towers (7-px patches)


def model_dir(family: str, tokenizer: str, root: Path) -> Path:
    """tokenizer.json with the family's special tokens + tokenizer_config.json with its template."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIALS[family]]
    )
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    # Qwen3-VL: the Qwen chat template (its image markup is Qwen2-VL's)
    name = TEMPLATE_FILE_OF.get(family, family)
    config = {"chat_template": (TEMPLATES / f"{name}.jinja").read_text()}
    if family == "internvl":
        config["extra_special_tokens"] = {
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        }
    if family in ("llava", "llava_next", "mistral3"):
        config["bos_token"], config["eos_token"] = "<s>", "</s>"
    if family == "ernie45vl":
        config["bos_token"], config["eos_token"] = "<|begin_of_sentence|>", "<|end_of_sentence|>"
        config["extra_special_tokens"] = {
            f"{kind}_{part}token": f"<|{kind.upper()}_{name}|>"
            for kind in ("image", "video")
            for part, name in (("", "PLACEHOLDER"), ("start_", "START"), ("end_", "END"))
        }
    if family == "aya_vision":
        config["bos_token"], config["eos_token"] = "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"
        config["pad_token"] = "<PAD>"
    if family == "granite_docling":
        config["eos_token"] = config["pad_token"] = "<|end_of_text|>"
    if family == "idefics2":
        config["bos_token"], config["eos_token"] = "<s>", "<end_of_utterance>"
    if family == "aria":
        config["eos_token"], config["pad_token"] = "<|im_end|>", "<pad>"
        config["extra_special_tokens"] = {"image_token": "<|img|>"}
    if family == "gemma3":
        config["bos_token"], config["eos_token"] = "<bos>", "<eos>"
        config["extra_special_tokens"] = {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        }
    if family == "qwen2_5_omni":  # its processor reads each medium's token by name
        config["eos_token"], config["pad_token"] = "<|im_end|>", "<|endoftext|>"
        config["extra_special_tokens"] = {
            "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
            "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
            "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
        }  # fmt: skip
    if family == "gemma4":  # its processor reads the audio tokens too, images or not
        config["bos_token"], config["eos_token"] = "<bos>", "<eos>"
        config["extra_special_tokens"] = {
            "boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
            "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>",
        }  # fmt: skip
    if family in DEEPSEEK_STYLE:
        config["bos_token"] = "<｜begin▁of▁sentence｜>"
        config["eos_token"] = "<｜end▁of▁sentence｜>"
        config["extra_special_tokens"] = {"image_token": "<image_placeholder>"}
        if family == "janus":
            config["extra_special_tokens"] |= {"boi_token": "<begin_of_image>",
                                               "eoi_token": "<end_of_image>"}  # fmt: skip
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def gemma4_processor(tok, image_processor):
    """Gemma 4's processor for images and text: built without its audio feature extractor and
    video processor (the video one needs torchvision, which has no CPU build for this torch on
    the registry)."""
    from transformers import Gemma4Processor

    class ImagesOnly(Gemma4Processor):
        def check_argument_for_proper_class(self, name, arg):
            if arg is None and name in ("feature_extractor", "video_processor"):
                return None
            return super().check_argument_for_proper_class(name, arg)

    return ImagesOnly(feature_extractor=None, image_processor=image_processor, tokenizer=tok,
                      video_processor=None)  # fmt: skip


def pixtral_processor():
    """Mistral 3's processor (``PixtralProcessor``). Its module imports a resize helper from the
    torchvision image processor; without torchvision (no CPU build for this torch on the
    registry) that import is pointed at the PIL image processor, which defines the same helper."""
    import importlib.util
    import sys

    if importlib.util.find_spec("torchvision") is None:
        import transformers.models.pixtral.image_processing_pil_pixtral as pil

        sys.modules.setdefault("transformers.models.pixtral.image_processing_pixtral", pil)
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    return PixtralProcessor


# the vision policy that counts what each tiny model's processor (below) makes of an image: prep
# with it, the tokenizer and the template of model_dir(), and the packer checks every sample's
# length against prep's count (``--print-prep-args``; ``make train-hf`` does this)
PREP_POLICY = {
    "qwen2vl": "qwen2vl:min_pixels=3136,max_pixels=50176",  # 56*56 .. 28*28*64
    "internvl": f"internvl:max_tiles=4,tile_size={TILE},patch_size=7",
    "qwen25vl": "qwen2vl:min_pixels=3136,max_pixels=50176",
    "qwen2_5_omni": "qwen2vl:min_pixels=3136,max_pixels=50176",
    "qwen3vl": "qwen2vl:min_pixels=4096,max_pixels=65536,patch_size=16,merge_size=2",
    "glm4v": "glm4v:min_pixels=3136,max_pixels=100352",
    "gemma3": f"gemma3:image_size={TILE},patch_size=7,llm_tokens=16",
    "smolvlm": f"smolvlm:longest_edge={4 * TILE},tile={TILE},patch_size=7,tokens_per_tile=16",
    "llava_onevision": f"llava-onevision:tile_size={TILE},patch_size=7,max_grid=3,max_tiles=9",
    "mistral3": "mistral3:longest_edge=112,patch_size=14,merge_size=2",
    "llava_next": f"llava-next:tile_size={TILE},patch_size=7,grids=1x2.2x1.2x2.3x1.1x3",
    "gemma4": "gemma4:max_soft_tokens=70,patch_size=7,pooling_kernel_size=2",
    "ernie45vl": "ernie45vl:min_pixels=3136,max_pixels=50176",
    "llava": f"fixed:{TILE}/7",
    "deepseek_vl": f"fixed:{TILE}/7",
    "janus": f"fixed:{TILE}/7",
    "deepseek_vl_hybrid": f"deepseek-vl-hybrid:image_size={TILE},patch_size=7,"
    f"high_res_size={2 * TILE},high_res_patch_size=8",
    "ovis2": f"ovis2:max_tiles=4,tile_size={TILE},patch_size=7,hidden_stride=2",
    "aria": "aria:max_image_size=490,patch_size=35,tokens=16",  # its size_conversion
    "idefics2": f"idefics2:shortest_edge=28,longest_edge={TILE},patch_size=7,tokens_per_image=8",
    "granite_docling": f"granite-docling:max_tiles=4,tile_size={TILE},patch_size=7,"
    "tokens_per_tile=16",
    "aya_vision": f"aya-vision:max_tiles=4,tile_size={TILE},patch_size=7",
}


# the audio rule that counts what a family's processor makes of a recording (its feature
# extractor's frames and the tokens its tower gives them)
PREP_AUDIO = {"qwen2_5_omni": "qwen2_5_omni"}
# and the video rule of its video processor (Qwen2-VL's, with the pixel bounds its processor's
# call passes it): the demo's videos (--media) train through the vision tower with the images
PREP_VIDEO = {"qwen2_5_omni": "qwen2vl:source=transformers,min_pixels=100352,max_pixels=602112"}


def prep_args(family: str, tokenizer: str, root: Path) -> list[str]:
    """``equishard prep`` options that measure what this family's tiny model sees: its
    tokenizer and chat template (written to ``root``), its vision policy and audio rule."""
    mdir = model_dir(family, tokenizer, root)
    template = template_arg(family, mdir)
    audio = []
    if family in PREP_AUDIO:
        audio = ["--audio-rule", PREP_AUDIO[family]]
    if family in PREP_VIDEO:
        audio += ["--video-rule", PREP_VIDEO[family]]
    return ["--tokenizer", str(mdir / "tokenizer.json"), "--template", template,
            "--vision-policy", PREP_POLICY[family], *audio]  # fmt: skip


def measured_for(shards: str, family: str) -> bool:
    """Whether the generation was prepped with this family's policy (PREP_POLICY)."""
    from shards.read.prep_settings import PrepSettings
    from shards.store.manifest import open_generation

    spec = PrepSettings.from_manifest(open_generation(shards)).vision_policy["spec"]
    want = PREP_POLICY.get(family)
    if want is None:
        return False
    from dataprep.policies import parse_vision_policy

    return parse_vision_policy(spec) == parse_vision_policy(want)


# what these tiny models' processor calls take besides the processors' own defaults (Aria's
# call would put 980-px crops over its image processor's size): HFPacker's images_kwargs
IMAGES_KWARGS = {"aria": {"max_image_size": 490}}


def build(family: str, mdir: Path):
    """(processor, tiny model) of the family, from configs."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(mdir))
    ids = tok.convert_tokens_to_ids
    # the Qwen-style configs' vision token ids (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)
    qwen_ids = {f"{k}_token_id": ids(f"<|{t}|>") for k, t in (
        ("image", "image_pad"), ("video", "video_pad"),
        ("vision_start", "vision_start"), ("vision_end", "vision_end"))}  # fmt: skip
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)  # fmt: skip

    def no_video(cls):  # the video processors need torchvision; images are all this trains
        attrs = classmethod(lambda c: ["image_processor", "tokenizer"])
        return type(cls.__name__, (cls,), {"get_attributes": attrs})

    if family == "qwen2vl":
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        ip = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
        proc = no_video(tf.Qwen2VLProcessor)(image_processor=ip, tokenizer=tok)
        cfg = tf.Qwen2VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}},
            vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2),
            **qwen_ids,
        )
        return proc, tf.Qwen2VLForConditionalGeneration(cfg)
    if family == "qwen25vl":  # Qwen2-VL's rows; a tower of windowed attention (block 0)
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        ip = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
        proc = no_video(tf.Qwen2_5_VLProcessor)(image_processor=ip, tokenizer=tok)
        cfg = tf.Qwen2_5_VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}},
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, window_size=56, fullatt_block_indexes=[1]),
            **qwen_ids,
        )  # fmt: skip
        return proc, tf.Qwen2_5_VLForConditionalGeneration(cfg)
    if family == "qwen2_5_omni":  # the thinker: Qwen2.5-VL's tower beside a Whisper-style one
        return omni_thinker(tok, text)
    if family == "qwen3vl":  # 16-px patches; deepstack features into the first decoder layers
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        ip = Qwen2VLImageProcessorPil(
            patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
            min_pixels=64 * 64, max_pixels=32 * 32 * 64,
        )  # fmt: skip
        proc = no_video(tf.Qwen3VLProcessor)(image_processor=ip, tokenizer=tok)
        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]}
        cfg = tf.Qwen3VLConfig(
            text_config={**text, "head_dim": 16,
                         "rope_parameters": {**rope, "mrope_interleaved": True}},
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               patch_size=16, out_hidden_size=64, num_position_embeddings=64,
                               deepstack_visual_indexes=[0, 1]),
            **qwen_ids,
        )  # fmt: skip
        return proc, tf.Qwen3VLForConditionalGeneration(cfg)
    if family == "glm4v":  # GLM-4.1V: a Qwen-style tower, each image two frames
        from transformers.models.glm4v import Glm4vImageProcessorPil

        ip = Glm4vImageProcessorPil(
            size={"shortest_edge": 56 * 56, "longest_edge": 2 * 28 * 28 * 64}
        )
        proc = no_video(tf.Glm4vProcessor)(image_processor=ip, tokenizer=tok)
        cfg = tf.Glm4vConfig(
            text_config={**text, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                     "mrope_section": [4, 2, 2]}},
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64),
            image_token_id=ids("<|image|>"),
            video_token_id=ids("<|video|>"),
            image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"),
        )  # fmt: skip
        return proc, tf.Glm4vForConditionalGeneration(cfg)
    if family == "internvl":
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        ip = GotOcr2ImageProcessorPil(
            crop_to_patches=True, max_patches=4, size={"height": TILE, "width": TILE}
        )
        per_tile = (TILE // 7) ** 2 // 4
        proc = no_video(tf.InternVLProcessor)(
            image_processor=ip, tokenizer=tok, image_seq_length=per_tile
        )
        cfg = tf.InternVLConfig(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=[TILE, TILE], patch_size=[7, 7]),
            text_config={**text, "model_type": "qwen2"},
            image_token_id=ids("<IMG_CONTEXT>"),
            downsample_ratio=0.5,
            vision_feature_layer=-1,
        )  # fmt: skip
        return proc, tf.InternVLForConditionalGeneration(cfg)
    if family == "llava_onevision":  # anyres: up to 3x3 tiles + a base tile, SigLIP tower
        from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

        grid = [[i * TILE, j * TILE] for i in (1, 2, 3) for j in (1, 2, 3)]
        ip = LlavaOnevisionImageProcessorPil(
            size={"height": TILE, "width": TILE}, image_grid_pinpoints=grid
        )
        proc = no_video(tf.LlavaOnevisionProcessor)(
            image_processor=ip, tokenizer=tok, num_image_tokens=(TILE // 7) ** 2,
            vision_feature_select_strategy="full",
        )  # fmt: skip
        cfg = tf.LlavaOnevisionConfig(
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=TILE, patch_size=7),
            text_config={**text, "model_type": "qwen2"},
            image_token_index=ids("<image>"),
            video_token_index=ids("<video>"),
            image_grid_pinpoints=grid,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
        )  # fmt: skip
        return proc, tf.LlavaOnevisionForConditionalGeneration(cfg)
    if family == "llava_next":  # anyres for every image over llava-v1.6's five grids, CLIP tower
        from transformers.models.llava_next import LlavaNextImageProcessorPil

        grid = [[h * TILE, w * TILE] for h, w in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))]
        ip = LlavaNextImageProcessorPil(
            size={"shortest_edge": TILE}, crop_size={"height": TILE, "width": TILE},
            image_grid_pinpoints=grid,
        )  # fmt: skip
        proc = no_video(tf.LlavaNextProcessor)(
            image_processor=ip, tokenizer=tok, patch_size=7,
            vision_feature_select_strategy="default", num_additional_image_tokens=1,
        )  # fmt: skip
        cfg = tf.LlavaNextConfig(
            vision_config=dict(model_type="clip_vision_model", hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=TILE, patch_size=7),
            text_config={**text, "model_type": "llama"},
            image_token_index=ids("<image>"),
            image_grid_pinpoints=grid,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
        )  # fmt: skip
        return proc, tf.LlavaNextForConditionalGeneration(cfg)
    if family == "mistral3":  # Pixtral tower: images up to 4x4 merged patches, 2x2 merge
        from transformers.models.pixtral import PixtralImageProcessorPil

        ip = PixtralImageProcessorPil(
            size={"longest_edge": 4 * 28}, patch_size={"height": 14, "width": 14}
        )
        proc = no_video(pixtral_processor())(
            image_processor=ip, tokenizer=tok, patch_size=14, spatial_merge_size=2
        )
        cfg = tf.Mistral3Config(
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, image_size=4 * 28,
                               patch_size=14, head_dim=16),
            text_config={**text, "model_type": "mistral", "head_dim": 16},
            image_token_index=ids("[IMG]"),
            spatial_merge_size=2,
            vision_feature_layer=-1,
        )  # fmt: skip
        return proc, tf.Mistral3ForConditionalGeneration(cfg)
    if family == "smolvlm":  # up to 4x4 tiles + a global tile, pixel shuffle by 2
        from transformers.models.smolvlm import SmolVLMImageProcessorPil

        ip = SmolVLMImageProcessorPil(
            size={"longest_edge": 4 * TILE}, max_image_size={"longest_edge": TILE}
        )
        proc = no_video(tf.SmolVLMProcessor)(
            image_processor=ip, tokenizer=tok, video_processor=None,
            image_seq_len=(TILE // 7) ** 2 // 4,
        )  # fmt: skip
        cfg = tf.SmolVLMConfig(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=TILE, patch_size=7),
            text_config={**text, "model_type": "llama"},
            image_token_id=ids("<image>"),
            scale_factor=2,
        )  # fmt: skip
        return proc, tf.SmolVLMForConditionalGeneration(cfg)
    if family == "gemma3":  # SigLIP tower, its patches average-pooled to 4x4 soft tokens
        from transformers.models.gemma3 import Gemma3ImageProcessorPil

        ip = Gemma3ImageProcessorPil(
            size={"height": TILE, "width": TILE}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        proc = tf.Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=16)
        cfg = tf.Gemma3Config(
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=TILE, patch_size=7),
            # full attention: transformers 5.23's sliding-window mask misplaces the image
            # blocks of a packed row's later samples by one token
            text_config={**text, "model_type": "gemma3_text", "head_dim": 16,
                         "layer_types": ["full_attention"] * text["num_hidden_layers"]},
            image_token_index=ids("<image_soft_token>"),
            boi_token_index=ids("<start_of_image>"),
            eoi_token_index=ids("<end_of_image>"),
            mm_tokens_per_image=16,
        )  # fmt: skip
        return proc, tf.Gemma3ForConditionalGeneration(cfg)
    if family == "gemma4":  # its own tower over padded patch rows, 2x2 pools, 70 soft tokens
        from transformers.models.gemma4 import Gemma4ImageProcessorPil

        ip = Gemma4ImageProcessorPil(patch_size=7, pooling_kernel_size=2, max_soft_tokens=70)
        cfg = tf.Gemma4Config(
            # full attention: see Gemma 3's sliding window above; image tokens attend both ways
            text_config={**text, "head_dim": 16, "global_head_dim": 16,
                         "layer_types": ["full_attention"] * text["num_hidden_layers"],
                         "hidden_size_per_layer_input": 0,
                         "use_bidirectional_attention": "vision"},
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                               patch_size=7, pooling_kernel_size=2, position_embedding_size=64),
            image_token_id=ids("<|image|>"),
            boi_token_id=ids("<|image>"),
            eoi_token_id=ids("<image|>"),
        )  # fmt: skip
        return gemma4_processor(tok, ip), tf.Gemma4ForConditionalGeneration(cfg)
    if family in DEEPSEEK_STYLE:  # SigLIP: every image fit into a 56-px square, (56 / 7)^2 tokens
        from transformers.models.deepseek_vl import DeepseekVLImageProcessorPil
        from transformers.models.janus import JanusImageProcessorPil

        square = dict(size={"height": TILE, "width": TILE}, min_size=7)
        tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, image_size=TILE, patch_size=7)  # fmt: skip
        llama = {**text, "model_type": "llama"}
        n = (TILE // 7) ** 2
        if family == "deepseek_vl_hybrid":  # and SAM on each image's 2x copy, 8-px patches
            from transformers.models.deepseek_vl_hybrid import DeepseekVLHybridImageProcessorPil

            ip = DeepseekVLHybridImageProcessorPil(
                **square, high_res_size={"height": 2 * TILE, "width": 2 * TILE}
            )
            proc = tf.DeepseekVLHybridProcessor(image_processor=ip, tokenizer=tok,
                                                num_image_tokens=n)  # fmt: skip
            cfg = tf.DeepseekVLHybridConfig(
                vision_config={"model_type": "siglip_vision_model", **tower},
                high_res_vision_config=dict(hidden_size=32, output_channels=16,
                                            num_hidden_layers=2, num_attention_heads=2,
                                            image_size=2 * TILE, patch_size=8, window_size=2,
                                            global_attn_indexes=[1], mlp_dim=64, num_pos_feats=16),
                text_config=llama,
                image_token_id=ids("<image_placeholder>"),
            )  # fmt: skip
            return proc, tf.DeepseekVLHybridForConditionalGeneration(cfg)
        if family == "deepseek_vl":
            ip = DeepseekVLImageProcessorPil(**square)
            proc = tf.DeepseekVLProcessor(image_processor=ip, tokenizer=tok, num_image_tokens=n)
            siglip = {"model_type": "siglip_vision_model", **tower}
            cfg = tf.DeepseekVLConfig(vision_config=siglip, text_config=llama,
                                      image_token_id=ids("<image_placeholder>"))  # fmt: skip
            return proc, tf.DeepseekVLForConditionalGeneration(cfg)
        ip = JanusImageProcessorPil(**square)
        proc = tf.JanusProcessor(image_processor=ip, tokenizer=tok, num_image_tokens=n)
        cfg = tf.JanusConfig(
            vision_config={**tower, "projection_dim": 64, "depth": 1},
            text_config=llama,
            # its image-generation head, unused when it reads images
            vq_config=dict(embed_dim=8, num_embeddings=16, base_channels=32,
                           channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=64,
                           image_token_embed_dim=64, num_patches=n),
        )  # fmt: skip
        cfg.image_token_id = ids("<image_placeholder>")
        return proc, tf.JanusForConditionalGeneration(cfg)
    if family == "ernie45vl":  # Qwen-style tower, MoE decoder with vision experts, 3-D positions
        from transformers.models.ernie4_5_vl_moe import Ernie4_5_VLMoeImageProcessorPil
        from transformers.models.ernie4_5_vl_moe.processing_ernie4_5_vl_moe import (
            Ernie4_5_VLMoeProcessor,
        )

        ip = Ernie4_5_VLMoeImageProcessorPil(size={"shortest_edge": 56 * 56,
                                                   "longest_edge": 28 * 28 * 64})  # fmt: skip
        proc = no_video(Ernie4_5_VLMoeProcessor)(image_processor=ip, tokenizer=tok)
        cfg = tf.Ernie4_5_VLMoeConfig(
            text_config={**text, "head_dim": 16, "moe_intermediate_size": [64, 64], "moe_k": 2,
                         "moe_num_experts": 4, "moe_num_shared_experts": 1,
                         "mlp_layer_types": ["dense", "sparse"],
                         "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                             "mrope_section": [2, 2, 4]}},
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2),
            image_token_id=ids("<|IMAGE_PLACEHOLDER|>"),
            image_start_token_id=ids("<|IMAGE_START|>"),
            image_end_token_id=ids("<|IMAGE_END|>"),
            video_token_id=ids("<|VIDEO_PLACEHOLDER|>"),
            video_start_token_id=ids("<|VIDEO_START|>"),
            video_end_token_id=ids("<|VIDEO_END|>"),
        )  # fmt: skip
        return proc, tf.Ernie4_5_VLMoeForConditionalGeneration(cfg)
    if family == "granite_docling":  # page tiles + a thumbnail, deepstack features, a router
        from transformers.models.granite_docling import GraniteDoclingImageProcessorPil

        ip = GraniteDoclingImageProcessorPil(max_patches=4, size={"height": TILE, "width": TILE})
        # (56 / 7)^2 patches a tile, pixel-shuffled 2x2: 16 tokens
        proc = tf.GraniteDoclingProcessor(image_processor=ip, tokenizer=tok, image_seq_len=16)
        cfg = tf.GraniteDoclingConfig(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=TILE, patch_size=7,
                               scale_factor=2, out_hidden_size=text["hidden_size"],
                               deepstack_visual_indexes=[0, 1]),
            text_config={**text, "model_type": "granite_docling_text",
                         "pad_token_id": ids("<|end_of_text|>")},
            image_token_id=ids("<image>"),
            density_router_hidden_size=8,
        )  # fmt: skip
        return proc, tf.GraniteDoclingForConditionalGeneration(cfg)
    if family == "idefics2":  # each image within 28..56 px, padded with its pixel mask, a
        from transformers.models.idefics2 import Idefics2ImageProcessorPil  # perceiver resampler

        ip = Idefics2ImageProcessorPil(size={"shortest_edge": 28, "longest_edge": TILE})
        proc = tf.Idefics2Processor(image_processor=ip, tokenizer=tok, image_seq_len=8)
        cfg = tf.Idefics2Config(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=TILE, patch_size=7),
            perceiver_config=dict(hidden_size=text["hidden_size"], resampler_n_latents=8,
                                  resampler_depth=1, resampler_n_heads=2, resampler_head_dim=16,
                                  num_key_value_heads=2),
            text_config={**text, "model_type": "mistral", "head_dim": 16},
            image_token_id=ids("<image>"),
        )  # fmt: skip
        return proc, tf.Idefics2ForConditionalGeneration(cfg)
    if family == "aria":  # each image one 490-px crop with a pixel mask, an MoE decoder
        from transformers.models.aria import AriaImageProcessorPil

        # 35-px patches: (490 / 35)^2 = 196 patches a crop, 16 queries
        ip = AriaImageProcessorPil(max_image_size=490)
        proc = tf.AriaProcessor(image_processor=ip, tokenizer=tok, size_conversion={490: 16})
        cfg = tf.AriaConfig(
            vision_config=dict(model_type="idefics3_vision", hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=490, patch_size=35),
            text_config={**text, "model_type": "aria_text", "moe_num_experts": 4, "moe_topk": 2,
                         "moe_intermediate_size": 32, "moe_num_shared_experts": 1},
            image_token_id=ids("<|img|>"),
            projector_patch_to_query_dict={196: 16},
        )  # fmt: skip
        return proc, tf.AriaForConditionalGeneration(cfg)
    if family == "ovis2":  # covering grids of up to 4 tiles + a thumbnail, a visual tokenizer
        from transformers.models.ovis2 import Ovis2ImageProcessorPil

        ip = Ovis2ImageProcessorPil(
            crop_to_patches=True, max_patches=4, size={"height": TILE, "width": TILE}
        )
        # (56 / 7)^2 patches a tile, merged 2x2: 16 atoms
        proc = tf.Ovis2Processor(image_processor=ip, tokenizer=tok, image_seq_length=16)
        markers = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
        cfg = tf.Ovis2Config(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=TILE, patch_size=7,
                               hidden_stride=2, vocab_size=64),
            text_config={**text, "model_type": "qwen2"},
            image_token_id=ids("<IMG_ATOM>"),
            visual_indicator_token_ids=[ids(m) for m in markers],
            hidden_size=text["hidden_size"],
            vocab_size=len(tok),
        )  # fmt: skip
        return proc, tf.Ovis2ForConditionalGeneration(cfg)
    if family == "aya_vision":  # InternVL's tiling, up to 4 tiles + a global tile, TILE_k markers
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        ip = GotOcr2ImageProcessorPil(
            crop_to_patches=True, max_patches=4, size={"height": TILE, "width": TILE}
        )
        proc = tf.AyaVisionProcessor(image_processor=ip, tokenizer=tok, patch_size=14,
                                     img_size=TILE)  # fmt: skip
        cfg = tf.AyaVisionConfig(
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=TILE, patch_size=7),
            # full attention: see Gemma 3's sliding window above (Cohere 2 has the same mask)
            text_config={**text, "model_type": "cohere2", "head_dim": 16,
                         "layer_types": ["full_attention"] * text["num_hidden_layers"]},
            image_token_index=ids("<|IMG_PATCH|>"),
            downsample_factor=2,
        )  # fmt: skip
        return proc, tf.AyaVisionForConditionalGeneration(cfg)
    from transformers.models.clip import CLIPImageProcessorPil

    ip = CLIPImageProcessorPil(
        size={"shortest_edge": TILE}, crop_size={"height": TILE, "width": TILE}
    )
    proc = tf.LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    cfg = tf.LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, image_size=TILE, patch_size=7),
        text_config={**text, "model_type": "llama"},
        image_token_id=ids("<image>"),
        vision_feature_layer=-1,
    )  # fmt: skip
    return proc, tf.LlavaForConditionalGeneration(cfg)


def omni_thinker(tok, text: dict):
    """Qwen2.5-Omni's processor (images and recordings: its video processor needs torchvision,
    which has no CPU build for this torch on the registry; HFPacker builds the videos as it
    does) and a tiny thinker: Qwen2.5-VL's tower (images and videos), a Whisper-style audio
    tower over 128 mel bins in chunks of 2 * n_window frames."""
    import transformers as tf
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    class Processor(tf.Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, name, arg):
            if arg is None and name == "video_processor":
                return None
            return super().check_argument_for_proper_class(name, arg)

    ip = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    fe = tf.WhisperFeatureExtractor(feature_size=128, chunk_length=300)  # Qwen2.5-Omni's
    proc = Processor(image_processor=ip, feature_extractor=fe, tokenizer=tok)
    ids = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]}
    cfg = tf.Qwen2_5OmniThinkerConfig(
        text_config={**text, "rope_parameters": rope},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, window_size=56, fullatt_block_indexes=[1]),
        audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2,
                          encoder_ffn_dim=64, output_dim=64, num_mel_bins=128,
                          max_source_positions=1500, n_window=100),
        image_token_index=ids("<|IMAGE|>"), video_token_index=ids("<|VIDEO|>"),
        audio_token_index=ids("<|AUDIO|>"), audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"),
    )  # fmt: skip
    cfg.vision_start_token_id = ids("<|vision_bos|>")  # read by its get_rope_index
    return proc, tf.Qwen2_5OmniThinkerForConditionalGeneration(cfg)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", help="generation root written by 'make shards'")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json (the demo's)")
    p.add_argument("--family", choices=FAMILIES, default="qwen2vl")
    p.add_argument("--balance", choices=["off", "encoder", "llm", "both"], default="both")
    p.add_argument(
        "--parallel",
        choices=["ddp", "fsdp2"],
        default="ddp",
        help="DistributedDataParallel, or FSDP2 (fully_shard on each vision block and decoder "
        "layer, then the model: each rank holds a shard of every parameter; the balancing "
        "wrappers are unchanged)",
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="leave the phases that --balance does not balance as they are (by default they are "
        "measured by a dry run of the plan: one small gather per call, nothing moved)",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--jsonl", default=None, help="JSON lines file, one line per step and rank")
    p.add_argument(
        "--print-prep-args",
        metavar="DIR",
        help="write the family's tiny model folder (tokenizer.json with its special tokens, its "
        "chat template) to DIR, print the 'equishard prep' options that measure what it sees "
        f"(families: {', '.join(PREP_POLICY)}) and exit",
    )
    args = p.parse_args()
    if args.print_prep_args:
        if args.family not in PREP_POLICY:
            p.error(f"--print-prep-args: no prep settings for {args.family} yet")
        print(" ".join(prep_args(args.family, args.tokenizer, Path(args.print_prep_args))))
        return
    if not args.shards:
        p.error("--shards is required")

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    # torchrun's LOCAL_RANK names this process's GPU on its node (rank % device_count is wrong
    # when nodes hold different numbers of processes)
    local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
    device = torch.device("cuda", local) if backend == "nccl" else None
    if device is not None:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # every rank builds the same initial weights
    mdir = model_dir(
        args.family, args.tokenizer, Path(tempfile.gettempdir()) / f"equishard-{args.family}-{rank}"
    )
    processor, model = build(args.family, mdir)
    model.to(device or "cpu").train()
    # equishard: a group of its own for the exchanges, so they never interleave with DDP's
    group = dist.new_group(backend=backend)
    balance_model(  # equishard
        model,
        group=group,
        encoder=args.balance in ("encoder", "both"),
        llm=args.balance in ("llm", "both"),
        policy=RedistributePolicy(placement="identity"),
        measure=not args.no_measure,  # the loads of a phase not balanced are logged too
    )
    spec = family_of(args.family)  # equishard's family spec: 3-D positions, template family
    rope = model.model.get_rope_index if spec.packer.rope_positions else None
    template = template_arg(args.family, mdir)
    images_kwargs = IMAGES_KWARGS.get(args.family, {})
    packer_family = spec.name
    if measured_for(args.shards, args.family):
        # equishard: the template prep measured with, the processor's pixel bounds checked
        # against prep's policy, and every sample's length against prep's count
        packer = HFPacker.from_generation(
            args.shards, processor, family=packer_family, template=template, rope_index=rope,
            images_kwargs=images_kwargs,
        )  # fmt: skip
    else:
        # a generation prepped with other settings (the demo's InternVL tiles and chatml): its
        # lengths differ from the rows built here, so the cost check would stop at the first
        # sample. Prep with --print-prep-args' options to train on checked lengths.
        if rank == 0:
            print(f"note: {args.shards} was not prepped with {args.family}'s settings: sample "
                  "lengths are not checked against prep (see --print-prep-args)")  # fmt: skip
        packer = HFPacker(
            family=packer_family, processor=processor, template=template, rope_index=rope,
            images_kwargs=images_kwargs, check_costs=False,
        )  # fmt: skip
    if rank == 0:
        print(f"costs checked against prep: {packer.check_costs is not False}")
    data = GroupDataset(args.shards, RankInfo(rank=rank, world_size=world), transform=packer)
    if args.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        # per block, as accelerate and torchtitan shard: each vision block and decoder layer
        # (HF's _no_split_modules), then the rest; a rank the balancer leaves without images
        # runs copies so that it joins every block's all-gather (idle_ranks="auto")
        blocks = set(model._no_split_modules or ())
        for module in [m for m in model.modules() if type(m).__name__ in blocks]:
            fully_shard(module)
        ddp = fully_shard(model)
        ddp.set_reduce_scatter_unused_params(True)  # FSDP2's find_unused_parameters
    else:
        ddp = DistributedDataParallel(model, find_unused_parameters=True)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    log = open(args.jsonl, "a") if args.jsonl and rank == 0 else None  # noqa: SIM115
    times = []
    for step, item in zip(range(args.steps), data, strict=False):
        t0 = time.perf_counter()
        batch = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in item["samples"].items()
        }
        targets = global_targets(
            batch["labels"], group
        )  # equishard: normalize by all ranks' targets
        out = ddp(**batch, num_items_in_batch=targets, use_cache=False)
        # DDP and FSDP2 average gradients over ranks; the loss is already a global mean
        (out.loss * world).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        times.append(seconds)
        inner = model.model
        tower = (
            getattr(inner, "visual", None)
            or getattr(inner, "vision_tower", None)
            or inner.vision_model  # SmolVLM
        )
        decoder = getattr(inner, "language_model", None) or inner.text_model
        loss = out.loss.detach().reshape(1)
        dist.all_reduce(loss)  # the global mean over every rank's target tokens
        rec = {"step": step, "rank": rank, "seconds": seconds, "loss": float(loss),
               "tokens": int(batch["input_ids"].shape[1])}  # fmt: skip
        rec["balance_seconds"] = 0.0  # gather + plan + forward exchanges
        audio = getattr(inner, "audio_tower", None)  # Qwen2.5-Omni's: its own phase
        for name, mod in (("encoder", tower), ("audio", audio), ("llm", decoder)):
            route = getattr(mod, "last_route", None)
            if route is not None:
                rec["balance_seconds"] += sum(route.seconds.values())
                rec[f"{name}_before"] = route.loads_before.tolist()
                rec[f"{name}_after"] = route.loads_after.tolist()
                # the slowest rank's load over the mean: 1.0 is even
                ratios = route.summary()
                rec[f"{name}_max_over_mean_before"] = ratios["max_over_mean_before"]
                rec[f"{name}_max_over_mean_after"] = ratios["max_over_mean_after"]
                # what balancing gives (a phase not balanced: what it would have given)
                rec[f"{name}_max_over_mean_planned"] = ratios["max_over_mean_planned"]
                rec[f"{name}_balanced"] = not route.method.startswith("dry run")
        everyone = [None] * world
        dist.all_gather_object(everyone, rec)
        if rank == 0:
            for r in everyone:
                print(json.dumps(r))
                if log:
                    log.write(json.dumps(r) + "\n")
    if rank == 0:
        print(f"{args.family} balance={args.balance}: {len(times)} steps, "
              f"mean step {sum(times) / max(1, len(times)):.3f} s on rank 0")  # fmt: skip
    dist.barrier()  # no rank tears its groups down while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
