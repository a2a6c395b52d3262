"""Runtime balancing inside real Hugging Face VLMs (tiny configs, random weights, no download):
Qwen2-VL (patches + grid_thw, 3-D mrope positions), Qwen2.5-VL (the same with window
attention inside each image), Qwen3-VL (the same plus deepstack features
injected into the first decoder layers at the visual tokens), Qwen3.5, GLM-4.1V and GLM-4.6V (Qwen-style
towers), InternVL and LLaVA (tiles) and
LLaVA-NeXT and LLaVA-OneVision (anyres: a varying number of tiles per image, unpadded and joined
with newline embeddings after the tower; OneVision's multi-image samples without anyres), and
more that teams train: Llama 4, Aya Vision, Command A Vision, VipLLaVA, Idefics2, ERNIE 4.5-VL,
Qwen2.5-Omni's thinker, LFM2-VL (NaFlex tower), Gemma 4 (patch rows with positions). On 4 gloo ranks
with uneven batches, an image-less rank and an empty rank, the loss and every parameter's
gradient with encoder and LLM balancing, without balancing, and from a single process over the
concatenated global batch agree (HF's loss runs in float32: float32 tolerance on a float64
model); images and samples really move, and the LLM loads even out."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.dist_helper import run_ranks
from tests.sweeps import sweep

transformers = pytest.importorskip("transformers")

IMG, VSTART, VEND, VIDEO = 999, 997, 996, 998
TEXT_ONLY = [(30, None, 0), (25, None, 3), (40, None, 0)]  # long samples, no pixel_values
# Qwen-style towers: each image a (t, h, w) patch grid; ranks uneven, empty, image-less
QWEN_LAYOUT = [
    [(5, (1, 8, 10), 7), (3, (1, 8, 8), 4), (2, (1, 6, 8), 2), (9, None, 0)],
    [],
    [(4, (1, 4, 4), 6)],
    TEXT_ONLY,
]
# Granite Docling: tiles [1, tiles, C, H, W] with a mask of real tiles, deepstack features;
# "_fine": every rank's batch on its fine connector path (tile_fine_mask), which the tower
# takes as a batch-wide flag
GRANITE = ("granite_docling", "granite_docling_fine")
# per family and rank: samples as (text tokens before, image or None, text tokens after);
# an image is a grid (t, h, w) of patches for Qwen2-VL, a number of tiles for InternVL / LLaVA
LAYOUTS = {
    "qwen2vl": QWEN_LAYOUT,  # rank 1 empty
    "qwen25vl": [  # Qwen2.5-VL: window attention inside each image (4 x 4-patch windows)
        [(5, (1, 8, 12), 7), (3, (1, 8, 8), 4), (2, (1, 6, 8), 2), (9, None, 0)],
        [],
        [(4, (1, 4, 4), 6)],
        TEXT_ONLY,
    ],
    "qwen3vl": QWEN_LAYOUT,
    "qwen35": QWEN_LAYOUT,
    "glm4v": QWEN_LAYOUT,
    # the MoE decoders teams train (Qwen3-VL-30B-A3B, GLM-4.5V): routed experts, a shared one
    "qwen3vl_moe": QWEN_LAYOUT,
    # Qwen2.5-Omni's thinker (the part that is trained): Qwen2.5-VL's tower beside an audio one
    "qwen25omni": [
        [(5, (1, 8, 12), 7), (3, (1, 8, 8), 4), (2, (1, 6, 8), 2), (9, None, 0)],
        [],
        [(4, (1, 4, 4), 6)],
        TEXT_ONLY,
    ],
    # ERNIE 4.5-VL: a Qwen-style tower named .vision_tower, a resampler after it, and a decoder
    # whose vision tokens go to experts of their own (moe_mm_token_type_ids, per token)
    "ernie45vl_moe": QWEN_LAYOUT,
    "glm4v_moe": QWEN_LAYOUT,
    # GLM-4.6V: GLM-4.1V's tower and decoder under a model class of its own
    "glm46v": QWEN_LAYOUT,
    "internvl": [[(5, 3, 7), (3, 2, 4), (2, 2, 2), (9, None, 0)], [], [(4, 1, 6)], TEXT_ONLY],
    # SmolVLM (Idefics3's architecture): tiles [1, N, C, H, W] with a pixel mask per tile
    "smolvlm": [[(5, 3, 7), (3, 2, 4), (2, 2, 2), (9, None, 0)], [], [(4, 1, 6)], TEXT_ONLY],
    # Gemma 3: one tile per image; its decoder gets 4-D masks (image tokens attend both ways,
    # a sliding-window layer) that must move with the samples. No empty rank: Gemma 3 builds
    # its masks before the decoder and transformers' mask code fails on an empty row
    "gemma3": [
        [(5, 3, 7), (3, 2, 4), (2, 2, 2), (9, None, 0)],
        [(2, None, 1)],
        [(4, 1, 6)],
        TEXT_ONLY,
    ],
    "llava": [[(5, 1, 7), (3, 1, 4), (2, 1, 2), (9, None, 0)], [], [(4, 1, 6)], TEXT_ONLY],
    # more tile towers: Aya Vision and Command A Vision (SigLIP, pixel shuffle; Cohere 2
    # decoders), VipLLaVA (CLIP features of several layers), Idefics2 (a perceiver resampler
    # per tile, patch masks), Llama 4 (its own tower with pixel shuffle; an MoE decoder inside
    # a causal LM)
    **{
        f: [[(5, 3, 7), (3, 2, 4), (2, 2, 2), (9, None, 0)], [], [(4, 1, 6)], TEXT_ONLY]
        for f in ("aya_vision", "cohere2_vision", "vipllava", "idefics2", "llama4")
    },
    # DeepSeek-VL and Janus (SigLIP tiles, an aligner; Janus's image-generation parts idle),
    # DeepSeek-VL's hybrid (a second tower, SAM, on each image's high-resolution copy), Aria
    # (Idefics3-style tiles with pixel masks, a query-attention projector, an MoE decoder),
    # Ovis2 (a visual tokenizer: tiles to probabilities over a visual vocabulary)
    **{
        f: [[(5, 3, 7), (3, 2, 4), (2, 2, 2), (9, None, 0)], [], [(4, 1, 6)], TEXT_ONLY]
        for f in ("deepseek_vl", "deepseek_vl_hybrid", "janus", "aria", "ovis2", *GRANITE)
    },
    # Mistral 3 (Pixtral tower): images of their own sizes (height, width), padded per batch
    "mistral3": [
        [(5, (28, 56), 7), (3, (56, 56), 4), (2, (28, 28), 2), (9, None, 0)],
        [],
        [(4, (84, 28), 6)],
        TEXT_ONLY,
    ],
    # LLaVA-OneVision: each image's (height, width); a sample with one image is cut into the
    # anyres grid's tiles plus a base tile (3 to 5 here), a multi-image sample's images are not
    "llava_onevision": [
        [(5, ((20, 30),), 7), (3, ((60, 30), (50, 50)), 4), (2, ((50, 50),), 2), (9, None, 0)],
        [],
        [(4, ((10, 90),), 6)],
        TEXT_ONLY,
    ],
    "llava_next": [  # anyres for every image, also in a multi-image sample
        [(5, ((20, 30),), 7), (3, ((60, 30), (50, 50)), 4), (2, ((50, 50),), 2), (9, None, 0)],
        [],
        [(4, ((10, 90),), 6)],
        TEXT_ONLY,
    ],
}
# LFM2-VL (SigLIP2 NaFlex): each image's patch grid (rows, cols), its patch rows padded with a
# mask to the rank's largest image + 3 (each rank pads its own way); its decoder here without
# LFM2's short convolutions (see test_hf_guards)
LAYOUTS["lfm2vl"] = [
    [(5, (4, 6), 7), (3, (2, 4), 4), (2, (4, 4), 2), (9, None, 0)],
    [],
    [(4, (2, 2), 6)],
    TEXT_ONLY,
]
# Gemma 4: each image's patch grid (rows, cols), its patch rows with their (x, y) positions,
# padded (position -1) to the rank's largest image + 4 rows (each rank pads its own way); 2x2
# pooling to soft tokens (decoders: see build_model). No empty rank: as Gemma 3's, its mask
# code (before the decoder) fails on an empty row
LAYOUTS["gemma4"] = LAYOUTS["gemma4_ple"] = [
    [(5, (4, 6), 7), (3, (2, 4), 4), (2, (4, 4), 2), (9, None, 0)],
    [(2, None, 1)],
    [(4, (2, 2), 6)],
    TEXT_ONLY,
]
GEMMA4 = ("gemma4", "gemma4_ple")
ANYRES = ("llava_onevision", "llava_next")
# patches + grid_thw
QWEN_STYLE = (
    "qwen2vl",
    "qwen25vl",
    "qwen3vl",
    "qwen3vl_moe",
    "qwen35",
    "glm4v",
    "glm4v_moe",
    "glm46v",
    "ernie45vl_moe",
    "qwen25omni",
)
PATCH_ROW = {"ernie45vl_moe": 3 * 14 * 14}  # else 3 x 2 frames x 14 x 14
OV_PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56], [28, 84], [84, 28]]
TILE = 28  # tile side: 7-px patches, 16 per tile
HIRES = 32  # DeepSeek-VL hybrid's high-resolution copies: 8-px patches for its SAM tower
# pixel shuffle 0.5 (InternVL) or by 2 (SmolVLM) / one token per patch (LLaVA)
TOKENS_PER_TILE = {
    "internvl": 4,
    "llava": 16,
    "smolvlm": 4,
    "gemma3": 4,  # pooled 2x2
    "aya_vision": 4,
    "cohere2_vision": 4,
    "vipllava": 16,
    "idefics2": 8,  # the resampler's latents
    "deepseek_vl": 16,
    "deepseek_vl_hybrid": 16,
    "janus": 16,
    "aria": 4,  # the projector's queries for 16 patches
    "ovis2": 4,  # hidden stride 2
    "granite_docling": 4,  # pixel shuffle by 2
    "granite_docling_fine": 16,  # its fine connector path: four times as many
    "llama4": 4,
}
PATCH_MASKED = ("smolvlm", "idefics2")  # [1, tiles, C, H, W] with a pixel mask per tile
TEXT = dict(
    vocab_size=1000,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# tiny MoE decoders: 4 routed experts, 2 per token (GLM: a shared expert, layer 0 dense)
MOE_QWEN = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1
)
MOE_GLM = dict(
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
)


def _tile_tower(model_type: str | None = None) -> dict:
    """A tiny CLIP / SigLIP / Idefics3-style tile tower: 28-px tiles of 7-px patches."""
    cfg = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=7,
    )
    return cfg if model_type is None else {"model_type": model_type, **cfg}


def qwen35_config(layer_types=("full_attention", "full_attention")):
    """A tiny Qwen3.5 (Qwen3-VL-style tower, hybrid decoder of ``layer_types``)."""
    import transformers as tf

    if not hasattr(tf, "Qwen3_5Config"):
        pytest.skip(f"transformers {tf.__version__} has no Qwen3.5")
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
    return tf.Qwen3_5Config(
        text_config={
            **TEXT,
            "head_dim": 8,
            "layer_types": list(layer_types),
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "rope_parameters": {**rope, "mrope_interleaved": True, "partial_rotary_factor": 1},
        },
        vision_config=dict(
            depth=2,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            patch_size=14,
            out_hidden_size=32,
            num_position_embeddings=64,
        ),
        image_token_id=IMG,
        video_token_id=998,
        vision_start_token_id=VSTART,
        vision_end_token_id=VEND,
    )


def lfm2vl_config(layer_types):
    """A tiny LFM2-VL: a SigLIP2 NaFlex tower, an LFM2 decoder of ``layer_types``."""
    import transformers as tf

    return tf.Lfm2VlConfig(
        vision_config=dict(
            model_type="siglip2_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=7,
            num_patches=16,  # a 4 x 4 position grid, resized to each image's
        ),
        text_config={**TEXT, "model_type": "lfm2", "layer_types": list(layer_types)},
        image_token_id=IMG,
        projector_hidden_size=32,
        downsample_factor=2,
    )


def build_model(family: str, seed: int = 0):
    import transformers as tf

    if family == "qwen2vl":
        cfg = tf.Qwen2VLConfig(
            text_config={**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
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
        cls = tf.Qwen2VLForConditionalGeneration
    elif family == "qwen25vl":
        cfg = tf.Qwen2_5_VLConfig(
            text_config={**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
            vision_config=dict(
                depth=2,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                in_channels=3,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                out_hidden_size=32,
                window_size=56,  # 2 x 2 merged patches per window: several per image
                fullatt_block_indexes=[1],
            ),
            image_token_id=IMG,
            video_token_id=998,
            vision_start_token_id=VSTART,
            vision_end_token_id=VEND,
        )
        cls = tf.Qwen2_5_VLForConditionalGeneration
    elif family in ("qwen3vl", "qwen3vl_moe"):
        if not hasattr(tf, "Qwen3VLConfig"):
            pytest.skip(f"transformers {tf.__version__} has no Qwen3-VL")
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
        moe = family == "qwen3vl_moe"
        cfg = (tf.Qwen3VLMoeConfig if moe else tf.Qwen3VLConfig)(
            text_config={
                **TEXT,
                **(MOE_QWEN if moe else {}),
                "head_dim": 8,
                "rope_parameters": {**rope, "mrope_interleaved": True},
            },
            vision_config=dict(
                depth=2,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                in_channels=3,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                out_hidden_size=32,
                num_position_embeddings=64,
                deepstack_visual_indexes=[0, 1],  # into decoder layers 0 and 1
            ),
            image_token_id=IMG,
            video_token_id=998,
            vision_start_token_id=VSTART,
            vision_end_token_id=VEND,
        )
        cls = tf.Qwen3VLMoeForConditionalGeneration if moe else tf.Qwen3VLForConditionalGeneration
    elif family == "qwen35":  # Qwen3.5's tower; its decoder with full-attention layers only
        # (its linear-attention layers keep packed samples apart only through
        # flash-linear-attention, a GPU library: test_hf_guards checks they are refused without
        # packing kwargs)
        cfg = qwen35_config()
        cls = tf.Qwen3_5ForConditionalGeneration
    elif family == "lfm2vl":
        cfg = lfm2vl_config(["full_attention"] * 2)
        cls = tf.Lfm2VlForConditionalGeneration
    elif family == "qwen25omni":
        cfg = tf.Qwen2_5OmniThinkerConfig(
            text_config={
                **TEXT,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "mrope_section": [2, 1, 1],
                },
            },
            vision_config=dict(
                depth=2,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                in_channels=3,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                out_hidden_size=32,
                window_size=56,
                fullatt_block_indexes=[1],
            ),
            audio_config=dict(
                d_model=16,
                encoder_layers=1,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                output_dim=32,
                num_mel_bins=16,
                max_source_positions=64,
                n_window=8,
            ),
            image_token_index=IMG,
            video_token_index=VIDEO,
            audio_token_index=993,
            audio_start_token_id=994,
            audio_end_token_id=995,
        )
        cfg.vision_start_token_id = VSTART  # read by its get_rope_index
        cls = tf.Qwen2_5OmniThinkerForConditionalGeneration
    elif family == "ernie45vl_moe":
        cfg = tf.Ernie4_5_VLMoeConfig(
            text_config={
                **TEXT,
                "head_dim": 8,
                "moe_intermediate_size": [16, 16],  # text experts, vision experts
                "moe_k": 2,
                "moe_num_experts": 4,
                "moe_num_shared_experts": 1,
                "mlp_layer_types": ["dense", "sparse"],
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "mrope_section": [1, 1, 2],
                },
            },
            vision_config=dict(
                depth=2,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                patch_size=14,
                spatial_merge_size=2,
                temporal_merge_size=2,
            ),
            image_token_id=IMG,
            image_start_token_id=VSTART,
            image_end_token_id=VEND,
            video_token_id=VIDEO,
            video_start_token_id=994,
            video_end_token_id=995,
        )
        cls = tf.Ernie4_5_VLMoeForConditionalGeneration
    elif family in ("glm4v", "glm4v_moe", "glm46v"):  # GLM-4.1V / 4.5V / 4.6V: Qwen-style
        moe = family == "glm4v_moe"
        config_cls = {"glm4v_moe": tf.Glm4vMoeConfig, "glm46v": tf.Glm46VConfig}
        cfg = config_cls.get(family, tf.Glm4vConfig)(
            text_config={
                **TEXT,
                **(MOE_GLM if moe else {}),
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "mrope_section": [2, 1, 1],
                    "partial_rotary_factor": 1.0,
                },
            },
            vision_config=dict(
                depth=2,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                image_size=28,
                patch_size=14,
                out_hidden_size=32,
            ),
            image_token_id=IMG,
            video_token_id=998,
            image_start_token_id=VSTART,
            image_end_token_id=VEND,
        )
        cls = {
            "glm4v": tf.Glm4vForConditionalGeneration,
            "glm4v_moe": tf.Glm4vMoeForConditionalGeneration,
            "glm46v": tf.Glm46VForConditionalGeneration,
        }[family]
    elif family == "mistral3":
        cfg = tf.Mistral3Config(
            vision_config=dict(
                model_type="pixtral",
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=112,
                patch_size=14,
                head_dim=8,
            ),
            text_config={**TEXT, "model_type": "mistral", "head_dim": 8},
            image_token_index=IMG,
            spatial_merge_size=2,
            vision_feature_layer=-1,
        )
        cls = tf.Mistral3ForConditionalGeneration
    elif family == "internvl":
        cfg = tf.InternVLConfig(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=[TILE, TILE],
                patch_size=[7, 7],
            ),
            text_config={**TEXT, "model_type": "qwen2"},
            image_token_id=IMG,
            downsample_ratio=0.5,
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
        )
        cls = tf.InternVLForConditionalGeneration
    elif family == "llava_onevision":
        cfg = tf.LlavaOnevisionConfig(
            vision_config=_tile_tower("siglip_vision_model"),
            text_config={**TEXT, "model_type": "qwen2"},
            image_token_index=IMG,
            video_token_index=998,
            image_grid_pinpoints=OV_PINPOINTS,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
        )
        cls = tf.LlavaOnevisionForConditionalGeneration
    elif family == "llava_next":
        cfg = tf.LlavaNextConfig(
            vision_config=_tile_tower("clip_vision_model"),
            text_config={**TEXT, "model_type": "llama"},
            image_token_index=IMG,
            image_grid_pinpoints=OV_PINPOINTS,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
        )
        cls = tf.LlavaNextForConditionalGeneration
    elif family == "gemma3":
        cfg = tf.Gemma3Config(
            vision_config=_tile_tower("siglip_vision_model"),
            text_config={
                **TEXT,
                "model_type": "gemma3_text",
                "head_dim": 8,
                # full attention only: transformers 5.23 shifts the image block of a packed
                # row's later samples by one token in its sliding-window mask, so one packed
                # row is no reference there
                "layer_types": ["full_attention", "full_attention"],
            },
            image_token_index=IMG,
            boi_token_index=VSTART,
            eoi_token_index=VEND,
            mm_tokens_per_image=TOKENS_PER_TILE["gemma3"],
        )
        cls = tf.Gemma3ForConditionalGeneration
    elif family == "smolvlm":
        cfg = tf.SmolVLMConfig(
            vision_config=_tile_tower(),
            text_config={**TEXT, "model_type": "llama"},
            image_token_id=IMG,
            scale_factor=2,
        )
        cls = tf.SmolVLMForConditionalGeneration
    elif family in ("aya_vision", "cohere2_vision"):
        cohere = {**TEXT, "model_type": "cohere2", "head_dim": 8}
        cohere["layer_types"] = ["full_attention"] * 2  # see Gemma 3's sliding window
        if family == "aya_vision":
            cfg = tf.AyaVisionConfig(
                vision_config=_tile_tower("siglip_vision_model"),
                text_config=cohere,
                image_token_index=IMG,
                downsample_factor=2,
            )
            cls = tf.AyaVisionForConditionalGeneration
        else:
            cfg = tf.Cohere2VisionConfig(
                vision_config=_tile_tower("siglip_vision_model"),
                text_config=cohere,
                image_token_id=IMG,
                downsample_factor=2,
                alignment_intermediate_size=64,
            )
            cls = tf.Cohere2VisionForConditionalGeneration
    elif family == "deepseek_vl":
        cfg = tf.DeepseekVLConfig(
            vision_config=_tile_tower("siglip_vision_model"),
            text_config={**TEXT, "model_type": "llama"},
            image_token_id=IMG,
        )
        cls = tf.DeepseekVLForConditionalGeneration
    elif family == "deepseek_vl_hybrid":
        cfg = tf.DeepseekVLHybridConfig(
            vision_config=_tile_tower("siglip_vision_model"),
            high_res_vision_config=dict(
                hidden_size=16,
                output_channels=8,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=HIRES,
                patch_size=8,
                window_size=2,
                global_attn_indexes=[1],
                mlp_dim=32,
                num_pos_feats=8,
            ),
            text_config={**TEXT, "model_type": "llama"},
            image_token_id=IMG,
        )
        cls = tf.DeepseekVLHybridForConditionalGeneration
    elif family == "janus":
        cfg = tf.JanusConfig(
            vision_config={**_tile_tower(), "projection_dim": 32, "depth": 1},
            text_config={**TEXT, "model_type": "llama"},
            vq_config=dict(
                embed_dim=8,
                num_embeddings=16,
                base_channels=32,  # its group norms: 32 groups
                channel_multiplier=[1, 1],
                num_res_blocks=1,
                projection_dim=32,
                image_token_embed_dim=32,
                num_patches=16,
            ),
        )
        cfg.image_token_id = IMG
        cls = tf.JanusForConditionalGeneration
    elif family == "aria":
        cfg = tf.AriaConfig(
            vision_config=_tile_tower("idefics3_vision"),
            text_config={
                **TEXT,
                "model_type": "aria_text",
                "moe_num_experts": 4,
                "moe_topk": 2,
                "moe_intermediate_size": 16,
                "moe_num_shared_experts": 1,
            },
            image_token_id=IMG,
            projector_patch_to_query_dict={16: TOKENS_PER_TILE["aria"]},
        )
        cls = tf.AriaForConditionalGeneration
    elif family == "ovis2":
        cfg = tf.Ovis2Config(
            vision_config={**_tile_tower(), "hidden_stride": 2, "vocab_size": 64},
            text_config={**TEXT, "model_type": "qwen2"},
            image_token_id=IMG,
            visual_indicator_token_ids=[990, 991, 992, 993, 994],
            hidden_size=32,
            vocab_size=1000,
        )
        cls = tf.Ovis2ForConditionalGeneration
    elif family in GRANITE:
        cfg = tf.GraniteDoclingConfig(
            vision_config={
                **_tile_tower(),
                "scale_factor": 2,
                "out_hidden_size": TEXT["hidden_size"],
                "deepstack_visual_indexes": [0, 1],
                "use_fine_route": True,
            },
            text_config={**TEXT, "model_type": "granite_docling_text", "pad_token_id": 0},
            image_token_id=IMG,
            density_router_hidden_size=8,
        )
        cls = tf.GraniteDoclingForConditionalGeneration
    elif family == "vipllava":
        cfg = tf.VipLlavaConfig(
            vision_config=_tile_tower("clip_vision_model"),
            text_config={**TEXT, "model_type": "llama"},
            image_token_index=IMG,
            vision_feature_layers=[-2, -1],
        )
        cls = tf.VipLlavaForConditionalGeneration
    elif family == "idefics2":
        cfg = tf.Idefics2Config(
            vision_config=_tile_tower(),
            perceiver_config=dict(
                hidden_size=32,
                resampler_n_latents=TOKENS_PER_TILE["idefics2"],
                resampler_depth=1,
                resampler_n_heads=2,
                resampler_head_dim=8,
                num_key_value_heads=2,
            ),
            text_config={**TEXT, "model_type": "mistral", "head_dim": 8},
            image_token_id=IMG,
        )
        cls = tf.Idefics2ForConditionalGeneration
    elif family == "llama4":
        cfg = tf.Llama4Config(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=64,  # the pixel shuffle's width: hidden / ratio^2
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=TILE,
                patch_size=7,
                vision_output_dim=32,
                projector_input_dim=32,
                projector_output_dim=32,
            ),
            text_config={
                **TEXT,
                "head_dim": 8,
                "num_local_experts": 2,
                "intermediate_size_mlp": 64,
                "no_rope_layers": [1, 0],  # a RoPE layer and a NoPE one, as Llama 4 mixes
            },
            image_token_index=IMG,
        )
        cls = tf.Llama4ForConditionalGeneration
    elif family in ("gemma4", "gemma4_ple"):
        # gemma4: image tokens attend both ways inside each image (full-attention layers:
        # transformers 5.23's sliding-window mask misplaces those blocks in a packed row, as
        # Gemma 3's); gemma4_ple: per-layer inputs from each token's id, a sliding-window layer
        ple = family == "gemma4_ple"
        cfg = tf.Gemma4Config(
            text_config={
                **TEXT,
                "head_dim": 8,
                "global_head_dim": 8,
                "layer_types": [("sliding" if ple else "full") + "_attention", "full_attention"],
                "sliding_window": 16,
                "hidden_size_per_layer_input": 8 if ple else 0,
                "vocab_size_per_layer_input": TEXT["vocab_size"],
                "use_bidirectional_attention": None if ple else "vision",
            },
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                patch_size=7,
                pooling_kernel_size=2,
                position_embedding_size=16,
            ),
            image_token_id=IMG,
        )
        cls = tf.Gemma4ForConditionalGeneration
    else:
        cfg = tf.LlavaConfig(
            vision_config=_tile_tower("clip_vision_model"),
            text_config={**TEXT, "model_type": "llama"},
            image_token_id=IMG,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
        )
        cls = tf.LlavaForConditionalGeneration
    cfg._attn_implementation = "sdpa"
    if family.endswith("_moe") or family in ("llama4", "aria"):  # grouped_mm takes no doubles
        cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).double().train()
    if family == "gemma3":  # its projector starts at zero: no gradient would reach the tower
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.2)
    return model


def _anyres_images(family, model, sizes, rng) -> tuple[list[torch.Tensor], list[int]]:
    """One sample's images for LLaVA-NeXT / LLaVA-OneVision: tiles per image (OneVision: anyres
    only when the sample has one image, as its processor does) and the LLM tokens the model
    makes of each."""
    from transformers.models.llava_onevision.modeling_llava_onevision import (
        image_size_to_num_patches,
    )

    onevision = family == "llava_onevision"
    pix, tokens = [], []
    for size in sizes:
        n = (
            image_size_to_num_patches(image_size=size, grid_pinpoints=OV_PINPOINTS, patch_size=TILE)
            if len(sizes) == 1 or not onevision
            else 1
        )
        pix.append(torch.from_numpy(rng.normal(size=(n, 3, TILE, TILE))))
        extra = {"batch_num_images": [len(sizes)]} if onevision else {}
        with torch.no_grad():
            feats = model.model.get_image_features(
                pix[-1][None].to(model.dtype), torch.tensor([size]), **extra
            ).pooler_output
        tokens.append(int(feats[0].shape[0]))
    return pix, tokens


def _pad_tiles(pix: list[torch.Tensor]) -> torch.Tensor:
    """LLaVA-OneVision's [images, max tiles, C, H, W] (the model reads each image's own tiles)."""
    most = max(p.shape[0] for p in pix)
    return torch.stack([torch.cat([p, p.new_zeros(most - p.shape[0], *p.shape[1:])]) for p in pix])


def _pad_images(pix: list[torch.Tensor]) -> torch.Tensor:
    """Mistral 3's [images, C, H, W]: each image padded to the largest (its processor's way)."""
    h, w = max(p.shape[-2] for p in pix), max(p.shape[-1] for p in pix)
    return torch.cat([F.pad(p, (0, w - p.shape[-1], 0, h - p.shape[-2])) for p in pix])


def _pad_rows(pix: list[torch.Tensor], rows: int) -> torch.Tensor:
    """NaFlex images ``[1, patches, D]`` as ``[n, rows, D]``, zero rows after each's own."""
    return torch.cat([F.pad(p, (0, 0, 0, rows - p.shape[1])) for p in pix])


def _patch_positions(grids: list, rows: int) -> torch.Tensor:
    """Gemma 4's ``[n, rows, 2]`` (x, y) of each image's patches in row order, -1 after them."""
    out = torch.full((len(grids), rows, 2), -1, dtype=torch.long)
    for i, (h, w) in enumerate(grids):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        out[i, : h * w] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
    return out


def make_batches(family: str, model, layout=None):
    """Per rank: input_ids, labels, packed position ids (restarting per sample; Qwen2-VL's
    [4, 1, L] with the text row first), pixel_values (and Qwen2-VL's image_grid_thw,
    LLaVA-OneVision's image_sizes and batch_num_images)."""
    rng = np.random.default_rng(1)
    qwen = family in QWEN_STYLE
    anyres = family in ANYRES
    out = []
    for samples in layout or LAYOUTS[family]:
        ids, labels, pos, pix, grids, vids, vgrids, hires = [], [], [], [], [], [], [], []
        for before, image, after in samples:
            seq = list(rng.integers(3, 900, before))
            video = isinstance(image, tuple) and image[0] == "video"
            if video:  # Qwen-style: a video's (t, h, w) patches, t > 1
                grid = image[1]
                # Qwen3-VL: each temporal patch a frame of its own, between start and end
                frames = grid[0] if family == "qwen3vl" else 1
                for _ in range(frames):
                    seq += [VSTART] + [VIDEO] * (int(np.prod(grid)) // 4 // frames) + [VEND]
                rows = rng.normal(size=(int(np.prod(grid)), PATCH_ROW.get(family, 1176)))
                vids.append(torch.from_numpy(rows))
                vgrids.append(grid)
            elif image is not None and family in ("lfm2vl", *GEMMA4):  # (rows, cols) of patches
                rows, cols = image
                seq += [VSTART] + [IMG] * (rows // 2 * (cols // 2)) + [VEND]
                pix.append(torch.from_numpy(rng.normal(size=(1, rows * cols, 3 * 7 * 7))))
                grids.append(image)
            elif image is not None and family == "mistral3":  # (height, width) in pixels
                seq += [VSTART] + [IMG] * ((image[0] // 28) * (image[1] // 28)) + [VEND]
                pix.append(torch.from_numpy(rng.normal(size=(1, 3, *image))))
                grids.append(image)
            elif image is not None and anyres:
                tiles, tokens = _anyres_images(family, model, image, rng)
                for n in tokens:
                    seq += [IMG] * n
                pix += tiles
                grids.append(image)
            elif image is not None and qwen:
                seq += [VSTART] + [IMG] * (int(np.prod(image)) // 4) + [VEND]
                pix.append(
                    torch.from_numpy(
                        rng.normal(size=(int(np.prod(image)), PATCH_ROW.get(family, 1176)))
                    )
                )
                grids.append(image)
            elif image is not None:
                seq += [VSTART] + [IMG] * (image * TOKENS_PER_TILE[family]) + [VEND]
                pix.append(torch.from_numpy(rng.normal(size=(image, 3, TILE, TILE))))
                if family == "deepseek_vl_hybrid":  # each image's copy for its SAM tower
                    hires.append(torch.from_numpy(rng.normal(size=(image, 3, HIRES, HIRES))))
            seq += list(rng.integers(3, 900, after))
            t = torch.tensor(seq)[None]
            lab = t.clone()
            lab[0, 0] = -100  # a sample's first token is never a target
            lab[(t == IMG) | (t == VIDEO)] = -100
            text = torch.arange(t.shape[1])[None]
            if qwen:
                g = torch.tensor([image]) if image is not None and not video else None
                vg = torch.tensor([image[1]]) if video else None
                kinds = (t == IMG).int() + 2 * (t == VIDEO).int()  # text 0, image 1, video 2
                if family == "qwen25omni":  # no token kinds: it finds them itself
                    rope, _ = model.model.get_rope_index(
                        t, image_grid_thw=g, video_grid_thw=vg, attention_mask=torch.ones_like(t)
                    )
                else:
                    rope, _ = model.model.get_rope_index(
                        t, kinds, image_grid_thw=g, video_grid_thw=vg
                    )
                text = torch.cat([text[None], rope], dim=0)
            pos.append(text)
            ids.append(t)
            labels.append(lab)
        empty_pos = torch.zeros(4, 1, 0) if qwen else torch.zeros(1, 0)
        batch = {
            "input_ids": torch.cat(ids, 1) if ids else torch.zeros(1, 0, dtype=torch.long),
            "labels": torch.cat(labels, 1) if labels else torch.zeros(1, 0, dtype=torch.long),
            "position_ids": torch.cat(pos, -1) if pos else empty_pos.long(),
            "pixel_values": (
                torch.cat(pix).double()
                if pix and family not in ("mistral3", "lfm2vl", *GEMMA4)
                else None
            ),
        }
        if qwen:
            batch["image_grid_thw"] = torch.tensor(grids) if grids else None
        if family == "deepseek_vl_hybrid":
            batch["high_res_pixel_values"] = torch.cat(hires).double() if hires else None
        if family == "mistral3" and pix:
            batch["pixel_values"] = _pad_images(pix).double()
            batch["image_sizes"] = torch.tensor(grids)
        if vids:
            batch["pixel_values_videos"] = torch.cat(vids).double()
            batch["video_grid_thw"] = torch.tensor(vgrids)
        if anyres:
            batch["pixel_values"] = _pad_tiles(pix).double() if pix else None
            batch["image_sizes"] = torch.tensor([s for g in grids for s in g]) if grids else None
        if family == "llava_onevision":
            batch["batch_num_images"] = [len(g) for g in grids] if grids else None
        if family == "lfm2vl" and pix:  # padded to this rank's largest image + 3
            batch["pixel_values"] = _pad_rows(pix, max(p.shape[1] for p in pix) + 3).double()
            batch["spatial_shapes"] = torch.tensor(grids)
            batch["pixel_attention_mask"] = (
                torch.arange(batch["pixel_values"].shape[1])[None]
                < (batch["spatial_shapes"].prod(-1)[:, None])
            )
        if family in GEMMA4:  # its image tokens attend both ways, block by block
            batch["mm_token_type_ids"] = (batch["input_ids"] == IMG).long()
        if family in GEMMA4 and pix:  # padded to this rank's largest image + 4 rows
            batch["pixel_values"] = _pad_rows(pix, max(p.shape[1] for p in pix) + 4).double()
            batch["image_position_ids"] = _patch_positions(grids, batch["pixel_values"].shape[1])
        if family == "ernie45vl_moe":  # modality per token: for its positions and its experts
            ids = batch["input_ids"]
            batch["mm_token_type_ids"] = (ids == IMG).int()
            batch["moe_mm_token_type_ids"] = ((ids == IMG) | (ids == VSTART) | (ids == VEND)).int()
        if family == "gemma3":  # image tokens: bidirectional inside each image
            batch["token_type_ids"] = (batch["input_ids"] == IMG).long()
        if family == "aria" and pix:  # a pixel mask per tile; every other tile half padding
            mask = torch.ones((len(batch["pixel_values"]), TILE, TILE), dtype=torch.bool)
            mask[::2, :, TILE // 2 + 3 :] = False
            batch["pixel_mask"] = mask
        if family in GRANITE and pix:  # [1, tiles, ...], every tile real
            batch["pixel_values"] = batch["pixel_values"][None]
            batch["pixel_attention_mask"] = torch.ones(1, sum(map(len, pix)))
            batch["pixel_attention_mask"] = batch["pixel_attention_mask"].bool()
            if family == "granite_docling_fine":
                batch["tile_fine_mask"] = torch.ones(1, dtype=torch.bool)
        if family in PATCH_MASKED and pix:  # [1, tiles, ...]; every other tile half padding
            batch["pixel_values"] = batch["pixel_values"][None]
            mask = torch.ones((*batch["pixel_values"].shape[:2], TILE, TILE), dtype=torch.bool)
            mask[:, ::2, :, TILE // 2 + 3 :] = False
            batch["pixel_attention_mask"] = mask
            if family == "idefics2":  # padded to the rank's largest image: sizes differ
                grow = 7 * (len(out) % 3) + (len(out) % 2)  # by ranks (0, 8, 14, 7 px)
                for key in ("pixel_values", "pixel_attention_mask"):
                    batch[key] = F.pad(batch[key], (0, grow, 0, grow))
        out.append(batch)
    return out


def _step(model, batch, num_items):
    out = model(**batch, num_items_in_batch=num_items, use_cache=False)  # packed: no KV cache
    out.loss.backward()
    return out.loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _with_packing(batch: dict) -> dict:
    """The row with HF's packing kwargs as transformers derives them from the position ids
    (flash-attention varlen boundaries) and ``seq_idx``, as DataCollatorWithFlattening gives
    them; an empty row gets none."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    pos = batch["position_ids"]
    text = pos[0] if pos.ndim == 3 else pos
    if text.numel() == 0:
        return batch
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(text)
    seq_idx = ((text.reshape(-1) == 0).cumsum(0) - 1).to(torch.int32)[None]
    return {
        **batch,
        "cu_seq_lens_q": cu_q,
        "cu_seq_lens_k": cu_k,
        "max_length_q": int(max_q),
        "max_length_k": int(max_k),
        "seq_idx": seq_idx,
    }


def _record_packing(decoder, seen: list) -> None:
    """Record, per call of the decoder's own forward, whether the packing kwargs it got are
    the ones transformers derives from the position ids it got (the samples it runs)."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    forward = decoder.forward

    def recorded(*args, position_ids=None, **kw):
        text = position_ids[0] if position_ids.ndim == 3 else position_ids
        (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(text)
        starts = (text.reshape(-1) == 0).cumsum(0) - 1
        seen.append(
            kw["cu_seq_lens_q"].tolist() == cu_q.tolist()
            and kw["cu_seq_lens_k"].tolist() == cu_k.tolist()
            and kw["cu_seq_lens_q"].dtype == cu_q.dtype
            and kw["max_length_q"] == kw["max_length_k"] == int(max_q)
            and kw["seq_idx"].tolist() == starts[None].tolist()
        )
        return forward(*args, position_ids=position_ids, **kw)

    decoder.forward = recorded


def _decoder(model):
    """The decoder that balance_model wraps (Llama 4's language model is a causal LM: its
    inner model)."""
    inner = getattr(model, "model", model)
    decoder = getattr(inner, "language_model", None) or inner.text_model
    return decoder.model if hasattr(decoder, "lm_head") else decoder


def rank_main(
    rank, world, family, mode, shift=0, layout=None, packing=False, reentrant=None, aux=False
):
    """One step of ``family`` on this rank, ``mode`` balanced | plain. ``shift``: rank r
    takes the batch of rank r + shift; ``packing``: the rows carry HF's packing kwargs
    (:func:`_with_packing`); ``reentrant``: HF's activation checkpointing on, reentrant or
    not; ``aux``: an MoE model's router load-balancing loss added to the loss."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    model = build_model(family)
    if aux:
        model.config.text_config.output_router_logits = True
    batches = make_batches(family, model, layout)
    seen = []
    if packing:
        _record_packing(_decoder(model), seen)
    if reentrant is not None:  # every layer of the tower and decoder recomputed in backward
        model.activation_checkpointing_enable({"use_reentrant": reentrant})
    policy = RedistributePolicy(enabled=mode == "balanced", placement="identity")
    balance_model(model, encoder=True, llm=True, policy=policy)
    batch = batches[(rank + shift) % world]
    if packing:
        batch = _with_packing(batch)
    n = global_targets(batch["labels"])
    loss = _step(model, batch, n)
    dist.all_reduce(loss)
    grads = _grads(model)
    params = dict(model.named_parameters())
    names = sorted(params)
    flat = torch.cat([grads.get(k, torch.zeros_like(params[k])).reshape(-1) for k in names])
    dist.all_reduce(flat)
    inner = getattr(model, "model", model)  # Llama 4: no inner model
    tower = getattr(inner, "visual", None) or getattr(inner, "vision_tower", None)
    vision_route = (tower or inner.vision_model).last_route
    llm_route = getattr(_decoder(model), "last_route", None)
    # DeepSeek-VL hybrid's second tower (SAM on the high-resolution copies)
    second = getattr(getattr(inner, "high_res_vision_model", None), "last_route", None)
    return {
        "loss": float(loss),
        "grads": flat.numpy(),
        "names": names,
        "moved": (vision_route.moved, llm_route.moved if llm_route else 0),
        "second_moved": second.moved if second is not None else None,
        "loads": (llm_route.loads_before.tolist(), llm_route.loads_after.tolist())
        if llm_route
        else None,
        "packing_seen": seen,
        "checkpointed": model.is_activation_checkpointing,
    }


def reference(family: str, layout=None, packing=False):
    """One process, one packed row holding every rank's samples in rank order."""
    model = build_model(family)
    batches = make_batches(family, model, layout)
    keys = (
        ("input_ids", "labels", "token_type_ids")
        if family == "gemma3"
        else ("input_ids", "labels", "mm_token_type_ids")
        if family in GEMMA4
        else ("input_ids", "labels", "mm_token_type_ids", "moe_mm_token_type_ids")
        if family == "ernie45vl_moe"
        else ("input_ids", "labels")
    )
    cat = {k: torch.cat([b[k] for b in batches], dim=-1) for k in keys}
    cat["position_ids"] = torch.cat([b["position_ids"] for b in batches], dim=-1)
    with_images = [b for b in batches if b["pixel_values"] is not None]
    for k in (
        "pixel_values",
        "image_grid_thw",
        "image_sizes",
        "pixel_mask",
        "high_res_pixel_values",
    ):
        if (
            k in batches[0]
            and family not in (*ANYRES, *PATCH_MASKED, *GRANITE, "mistral3", "lfm2vl", *GEMMA4)
            and with_images
        ):
            cat[k] = torch.cat([b[k] for b in with_images])
    with_videos = [b for b in batches if "pixel_values_videos" in b]
    for k in ("pixel_values_videos", "video_grid_thw"):
        if with_videos:
            cat[k] = torch.cat([b[k] for b in with_videos])
    if family == "mistral3" and with_images:  # every image, padded to the largest of all
        cat["pixel_values"] = _pad_images([p[None] for b in with_images for p in b["pixel_values"]])
        cat["image_sizes"] = torch.cat([b["image_sizes"] for b in with_images])
    if family in ANYRES and with_images:  # every image's tiles, padded to the most of any
        cat["pixel_values"] = _pad_tiles([t for b in with_images for t in b["pixel_values"]])
        cat["image_sizes"] = torch.cat([b["image_sizes"] for b in with_images])
    if family == "llava_onevision" and with_images:
        cat["batch_num_images"] = [n for b in with_images for n in b["batch_num_images"]]
    if family == "lfm2vl" and with_images:  # one row per image, each with its mask and grid,
        rows = max(b["pixel_values"].shape[1] for b in with_images)  # padded to the most
        cat["pixel_values"] = _pad_rows([b["pixel_values"] for b in with_images], rows)
        cat["pixel_attention_mask"] = torch.cat(
            [
                F.pad(b["pixel_attention_mask"], (0, rows - b["pixel_values"].shape[1]))
                for b in with_images
            ]
        )
        cat["spatial_shapes"] = torch.cat([b["spatial_shapes"] for b in with_images])
    if family in GEMMA4 and with_images:  # every image's rows padded to the most of any
        rows = max(b["pixel_values"].shape[1] for b in with_images)
        cat["pixel_values"] = _pad_rows([b["pixel_values"] for b in with_images], rows)
        pos = [b["image_position_ids"] for b in with_images]
        cat["image_position_ids"] = torch.cat(
            [F.pad(q, (0, 0, 0, rows - q.shape[1]), value=-1) for q in pos]
        )
    if family in (*PATCH_MASKED, *GRANITE) and with_images:  # [1, tiles, ...] along dim 1
        side = max(b["pixel_values"].shape[-1] for b in with_images)  # Idefics2's differ:
        for k in ("pixel_values", "pixel_attention_mask"):  # padded to the largest
            grown = [
                F.pad(b[k], (0, side - b[k].shape[-1], 0, side - b[k].shape[-2]))
                if family in PATCH_MASKED  # per pixel (Granite Docling's mask: per tile)
                else b[k]
                for b in with_images
            ]
            cat[k] = torch.cat(grown, dim=1)
    if family == "granite_docling_fine" and with_images:
        cat["tile_fine_mask"] = torch.ones(1, dtype=torch.bool)
    if packing:
        cat = _with_packing(cat)
    n = int((cat["labels"][..., 1:] != -100).sum())
    loss = _step(model, cat, n)
    grads = _grads(model)
    params = dict(model.named_parameters())  # unused ones (LLaVA's last layer) count as 0
    flat = torch.cat(
        [grads.get(k, torch.zeros_like(params[k])).reshape(-1) for k in sorted(params)]
    )
    return float(loss), flat.numpy(), grads


# parameters at both ends of the vision path, which must receive gradient through the exchange
VISION_PARAMS = {
    "qwen2vl": ("model.visual.patch_embed.proj.weight", "model.visual.merger.mlp.2.weight"),
    "qwen25vl": ("model.visual.patch_embed.proj.weight", "model.visual.merger.mlp.2.weight"),
    "qwen3vl": (
        "model.visual.patch_embed.proj.weight",
        "model.visual.merger.linear_fc2.weight",
        "model.visual.deepstack_merger_list.0.linear_fc2.weight",  # reach the LLM via deepstack
        "model.visual.deepstack_merger_list.1.linear_fc2.weight",
    ),
    "qwen3vl_moe": (
        "model.visual.patch_embed.proj.weight",
        "model.visual.deepstack_merger_list.1.linear_fc2.weight",
    ),
    "qwen35": ("model.visual.patch_embed.proj.weight", "model.visual.merger.linear_fc2.weight"),
    "glm4v": ("model.visual.patch_embed.proj.weight", "model.visual.merger.down_proj.weight"),
    "glm4v_moe": ("model.visual.patch_embed.proj.weight", "model.visual.merger.down_proj.weight"),
    "glm46v": ("model.visual.patch_embed.proj.weight", "model.visual.merger.down_proj.weight"),
    "lfm2vl": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "qwen25omni": ("model.visual.patch_embed.proj.weight", "model.visual.merger.mlp.2.weight"),
    "ernie45vl_moe": (
        "model.vision_tower.patch_embed.proj.weight",
        "model.resampler_model.mlp.weight",  # after the tower, on the image's own rank
    ),
    "mistral3": (
        "model.vision_tower.patch_conv.weight",
        "model.multi_modal_projector.patch_merger.merging_layer.weight",
    ),
    "internvl": (
        "model.vision_tower.embeddings.patch_embeddings.projection.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "llava": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "llava_onevision": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
        "model.image_newline",  # joined to the features after the tower, per image
    ),
    "gemma3": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.mm_input_projection_weight",
    ),
    "smolvlm": (
        "model.vision_model.embeddings.patch_embedding.weight",
        "model.connector.modality_projection.proj.weight",
    ),
    "llava_next": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
        "model.image_newline",
    ),
    "aya_vision": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "cohere2_vision": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "vipllava": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.linear_2.weight",
    ),
    "deepseek_vl": (
        "model.vision_model.embeddings.patch_embedding.weight",
        "model.aligner.linear2.weight",
    ),
    "deepseek_vl_hybrid": (  # both towers, the aligner of their features
        "model.vision_model.embeddings.patch_embedding.weight",
        "model.high_res_vision_model.vision_encoder.patch_embed.projection.weight",
        "model.aligner.high_res_vision_proj.weight",
    ),
    "janus": (
        "model.vision_model.embeddings.patch_embedding.weight",
        "model.aligner.fc1.weight",
    ),
    "aria": (
        "model.vision_tower.embeddings.patch_embedding.weight",
        "model.multi_modal_projector.query",
    ),
    "ovis2": (
        "model.vision_tower.transformer.embeddings.patch_embedding.weight",
        "model.visual_embeddings_table.weight",
    ),
    **{  # the connector's path the batch takes
        f: (
            "model.vision_model.embeddings.patch_embedding.weight",
            f"model.vision_model.connector.{path}.projection.weight",
            f"model.vision_model.connector.{path}.deepstack_mergers.0.linear_2.weight",
        )
        for f, path in zip(GRANITE, ("coarse", "fine"), strict=True)
    },
    "idefics2": (
        "model.vision_model.embeddings.patch_embedding.weight",
        "model.connector.perceiver_resampler.norm.weight",
    ),
    "gemma4": (
        "model.vision_tower.patch_embedder.input_proj.weight",
        "model.embed_vision.embedding_projection.weight",
    ),
    "gemma4_ple": (
        "model.vision_tower.patch_embedder.input_proj.weight",
        "model.embed_vision.embedding_projection.weight",
        # per-layer inputs: computed on the samples' own rank, moved with them
        "model.language_model.embed_tokens_per_layer.weight",
    ),
    "llama4": (
        "vision_model.patch_embedding.linear.weight",
        "multi_modal_projector.linear_1.weight",
    ),
}


# the scenarios beyond balanced-vs-plain, and the families each runs for
SHIFTED = (
    "internvl",
    "qwen2vl",
    "llava_onevision",
    "smolvlm",
    "mistral3",
    "llama4",
    "lfm2vl",
    "gemma4",
    "granite_docling_fine",
)  # the empty rank is rank 0 (Gemma 4: its rank of one short text sample)
SHIFTED_FAST = ("internvl", "qwen2vl", "smolvlm", "gemma4")  # make test's; the rest in test-slow
NO_IMAGE = ("qwen3vl", "internvl", "llava_onevision", "smolvlm", "idefics2")
NO_IMAGE_FAST = ("qwen3vl", "internvl", "smolvlm")  # make test's; the rest in test-slow
NO_IMAGE_LAYOUT = [TEXT_ONLY, [], TEXT_ONLY[:1], TEXT_ONLY[1:]]
PACKING = ("qwen3vl", "gemma3")
# HF's activation checkpointing (what every large run turns on): reentrant or not
CHECKPOINTING = {"qwen2vl": True, "internvl": False, "gemma3": True}
# images and videos: HF calls the tower once for a rank's images and once for its videos, so
MOE = ("qwen3vl_moe", "glm4v_moe")
# ranks call it 2, 1, 1 and 0 times in this step
VIDEOS = ("qwen2vl", "qwen25vl", "qwen3vl")
VIDEO_LAYOUT = [
    [
        (5, (1, 8, 10), 7),
        (3, ("video", (2, 4, 4)), 4),
        (2, (1, 8, 8), 2),
        (4, ("video", (2, 6, 4)), 1),
    ],
    [(4, (1, 4, 4), 6)],
    [(2, ("video", (2, 4, 6)), 3), (9, None, 0)],
    TEXT_ONLY,
]


def rank_scenarios(rank, world, family):
    """Every scenario of ``family`` in one launch of the ranks (starting 4 processes that
    import torch and transformers is a good part of a scenario's time), each with a fresh
    model: balanced, plain, and those of SHIFTED / NO_IMAGE / PACKING it is in."""
    out = {"balanced": rank_main(rank, world, family, "balanced")}
    out["plain"] = rank_main(rank, world, family, "plain")
    if family in SHIFTED:
        out["shifted"] = rank_main(rank, world, family, "balanced", 1)
    if family in NO_IMAGE:
        out["no_image"] = rank_main(rank, world, family, "balanced", 0, NO_IMAGE_LAYOUT)
    if family in PACKING:
        out["packing"] = rank_main(rank, world, family, "balanced", 0, None, True)
    if family in VIDEOS:
        out["videos"] = rank_main(rank, world, family, "balanced", 0, VIDEO_LAYOUT)
    if family in MOE:  # the router's load-balancing loss on, balanced and not (no empty row:
        # HF's own aux loss fails on one, balanced or not)
        full = [r or [(2, None, 1)] for r in LAYOUTS[family]]
        out["aux"] = rank_main(rank, world, family, "balanced", 0, full, aux=True)
        out["aux_plain"] = rank_main(rank, world, family, "plain", 0, full, aux=True)
    if family in CHECKPOINTING:
        reentrant = CHECKPOINTING[family]
        out["checkpointing"] = rank_main(rank, world, family, "balanced", 0, None, False, reentrant)
    return out


def skip_if_transformers_fails(family: str) -> None:
    """Skip where the installed transformers fails the family's plain single-process step on
    its own, equishard not involved (transformers 5.24's Llama 4 reads ``image_outputs``
    from its language model's output, which has none); a fix upstream brings the test back."""
    if family != "llama4":
        return
    model = build_model(family)
    batch = make_batches(family, model)[0]
    try:
        _step(model, batch, global_count(batch))
    except AttributeError as e:
        if "image_outputs" in str(e):
            import transformers

            pytest.skip(f"transformers {transformers.__version__}'s {family} fails alone: {e}")
        raise


def global_count(batch: dict) -> int:
    return int((batch["labels"][..., 1:] != -100).sum())


@functools.cache
def scenarios(family: str) -> dict[str, list]:
    """Per scenario, every rank's result (one launch per family, shared by its tests)."""
    skip_if_transformers_fails(family)
    runs = run_ranks(rank_scenarios, 4, family, timeout=300)
    return {k: [r[k] for r in runs] for k in runs[0]}


def _equal_to_reference(runs, family, layout=None, packing=False):
    ref_loss, ref_grads, per_param = reference(family, layout, packing)
    # Gemma 4's tower pools and scales in float32 whatever the model's dtype (its padding, which
    # differs per rank, changes the float32 sums' rounding): float32 tolerance on its gradients
    atol = 1e-7 if family in GEMMA4 else 1e-9
    for r in runs:  # every rank holds the same reduced loss and gradients
        # HF's causal-LM loss runs in float32 (it upcasts the logits): float32 tolerance
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-6)
        np.testing.assert_allclose(r["grads"], ref_grads, rtol=1e-5, atol=atol)
    return per_param


# make test launches the families the scenarios below need (one launch serves all of a family's
# tests) and Qwen2-VL's; the other architectures' launches are in make test-slow
@pytest.mark.parametrize(
    "family",
    sweep(
        "balanced equals unbalanced equals one process",
        LAYOUTS,
        fast={"qwen2vl", *SHIFTED_FAST, *NO_IMAGE_FAST, *PACKING, *VIDEOS, *CHECKPOINTING, *MOE},
    ),
)
def test_balanced_equals_unbalanced_equals_single_process(family):
    balanced, plain = scenarios(family)["balanced"], scenarios(family)["plain"]
    per_param = _equal_to_reference(balanced + plain, family)
    for name in VISION_PARAMS[family]:
        assert per_param[name].abs().sum() > 0
    # images and samples moved, and the LLM loads evened out
    assert balanced[0]["moved"][0] > 0 and balanced[0]["moved"][1] > 0
    assert plain[0]["moved"] == (0, 0)
    if family == "deepseek_vl_hybrid":  # both towers balanced, the same images moved
        assert balanced[0]["second_moved"] == balanced[0]["moved"][0]
        assert plain[0]["second_moved"] in (0, None)
    before, after = balanced[0]["loads"]
    assert max(after) < max(before)


@pytest.mark.parametrize("family", sweep("the empty rank is rank 0", SHIFTED, fast=SHIFTED_FAST))
def test_empty_rank_zero_receives_images(family):
    """The empty rank is rank 0 (the first whose outputs the others read the structure from)
    and receives images it never asked the tower for: the balanced step still equals one
    process's (InternVL asks its tower for no per-layer states, the joining rank does)."""
    runs = scenarios(family)["shifted"]
    _equal_to_reference(runs, family)
    assert runs[0]["moved"][0] > 0


@pytest.mark.parametrize("family", sweep("a step without any image", NO_IMAGE, fast=NO_IMAGE_FAST))
def test_step_without_any_image(family):
    """No rank has an image this step (HF never calls the tower): every rank joins the tower's
    exchange with nothing, nobody hangs, and the step equals one process's."""
    runs = scenarios(family)["no_image"]
    _equal_to_reference(runs, family, NO_IMAGE_LAYOUT)
    assert runs[0]["moved"][0] == 0 and runs[0]["moved"][1] > 0


@pytest.mark.parametrize("family", PACKING)
def test_packing_kwargs_follow_the_samples(family):
    """Rows carrying HF's packing kwargs (flash-attention varlen boundaries, seq_idx; what
    DataCollatorWithFlattening gives for FlashAttention and for recurrent layers): after
    balancing, the decoder gets them for the samples it runs, equal to what transformers
    derives from the received position ids, not the rank's own stale ones; the empty rank,
    given none, gets them for what it receives; the step equals one process's."""
    runs = scenarios(family)["packing"]
    _equal_to_reference(runs, family, None, True)
    for r in runs:
        assert r["packing_seen"] and all(r["packing_seen"])
    assert runs[0]["moved"][1] > 0


@pytest.mark.parametrize("family", VIDEOS)
def test_images_and_videos(family):
    """A rank with images and videos calls the tower twice (HF: once per modality), others
    once or not at all: every rank takes part in as many tower exchanges as the busiest one,
    nobody hangs, and the step equals one process's."""
    runs = scenarios(family)["videos"]
    _equal_to_reference(runs, family, VIDEO_LAYOUT)
    assert runs[0]["moved"][0] > 0 and runs[0]["moved"][1] > 0


@pytest.mark.parametrize("family", list(CHECKPOINTING))
def test_activation_checkpointing(family):
    """HF's activation checkpointing recomputes every tower and decoder layer in the backward
    (reentrant for Qwen2-VL and Gemma 3, not for InternVL): the exchanges sit outside the
    recomputed layers, and the balanced step equals one process's without checkpointing."""
    runs = scenarios(family)["checkpointing"]
    assert all(r["checkpointed"] for r in runs)
    _equal_to_reference(runs, family)
    assert runs[0]["moved"][0] > 0 and runs[0]["moved"][1] > 0


@pytest.mark.parametrize("family", MOE)
def test_moe_router_aux_loss_as_without_balancing(family):
    """With the router's load-balancing loss on, each rank's loss is computed over its own
    tokens' router logits (a per-rank statistic in DP): the decoder's exchange brings every
    token's router logits home with its hidden states, so loss and gradients equal the
    unbalanced step's, and the aux loss did count (the loss differs from the one without)."""
    runs = scenarios(family)
    aux, plain, no_aux = runs["aux"], runs["aux_plain"], runs["balanced"]
    assert aux[0]["moved"][1] > 0
    for a, b in zip(aux, plain, strict=True):
        # HF's causal-LM loss runs in float32 (it upcasts the logits): float32 tolerance
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        np.testing.assert_allclose(a["grads"], b["grads"], rtol=1e-5, atol=1e-9)
    assert abs(aux[0]["loss"] - no_aux[0]["loss"]) > 1e-6
