"""The column names of the cost table and the plan, one constant each.

A column is named here once; every module that reads or writes one uses the constant (a typo
is then a ``NameError`` at import, not an empty column at run time). The schemas with the
types are :data:`equishard.contracts.cost_table.COST_SCHEMA` and
:data:`equishard.contracts.plan.PLAN_SCHEMA`; this module imports nothing, so the loader can
use the names without loading pyarrow.
"""

from __future__ import annotations

__all__ = [
    "AUDIO_SEQ_LENS",
    "AUDIO_TOKENS",
    "CACHE_KEY",
    "FINGERPRINT",
    "GROUP_LLM_COST",
    "GROUP_LLM_TOKENS",
    "GROUP_VIT_COST",
    "GROUP_VIT_TOKENS",
    "IMAGE_HEIGHTS",
    "IMAGE_WIDTHS",
    "LLM_TOKENS",
    "LOCATION",
    "MODALITY",
    "NUM_AUDIOS",
    "NUM_IMAGES",
    "NUM_VIDEOS",
    "SAMPLE_ID",
    "SOURCE",
    "TEXT_TOKENS",
    "VIDEO_SEQ_LENS",
    "VIDEO_TOKENS",
    "VIT_SEQ_LENS",
    "VIT_TOKENS",
]

# -- the cost table: one row per sample ----------------------------------------------------------
SAMPLE_ID = "sample_id"  # the sample's id, unique in the table
SOURCE = "source"  # the input file it was read from
NUM_IMAGES = "num_images"
VIT_TOKENS = "vit_tokens"  # the vision encoder's tokens, all images together
VIT_SEQ_LENS = "vit_seq_lens"  # the vision encoder's sequence length of each image
LLM_TOKENS = "llm_tokens"  # the LLM's tokens: text and the image tokens the template expands
TEXT_TOKENS = "text_tokens"
MODALITY = "modality"  # "text" or "image"
# the other encoder phases (equishard.contracts.phases): optional, all three or none
NUM_VIDEOS = "num_videos"
VIDEO_TOKENS = "video_tokens"  # the tower's tokens of the sample's video frames
VIDEO_SEQ_LENS = "video_seq_lens"  # the sequence length of each frame group the tower runs
NUM_AUDIOS = "num_audios"
AUDIO_TOKENS = "audio_tokens"  # the audio encoder's input frames over the sample's clips
AUDIO_SEQ_LENS = "audio_seq_lens"  # the length of each window the audio encoder runs
IMAGE_WIDTHS = "image_widths"
IMAGE_HEIGHTS = "image_heights"
LOCATION = "location"  # where the record is: write reads it from there
FINGERPRINT = "fingerprint"  # the record's content digest: write refuses a changed input
CACHE_KEY = "cache_key"  # a cheap change detector, sealed with the row's counts and settings

# -- the plan: one row per sample, with its group's step and rank --------------------------------
GROUP_VIT_TOKENS = "group_vit_tokens"
GROUP_LLM_TOKENS = "group_llm_tokens"
GROUP_VIT_COST = "group_vit_cost"
GROUP_LLM_COST = "group_llm_cost"
