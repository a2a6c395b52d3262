"""Video and audio rules: what each model family's processor makes of one video or recording.

Beside :mod:`dataprep.policies` (the vision policies, one image at a time), a rule here takes
one item's header and returns its :class:`MediaCost`: the sequences its encoder runs and the
tokens the LLM sees. One module per rule; :class:`MediaRule` is their base.
"""

from dataprep.media_rules.base import MediaCost, MediaRule
from dataprep.media_rules.ernie_video import ErnieVideoRule
from dataprep.media_rules.gemma4_audio import Gemma4AudioRule
from dataprep.media_rules.gemma4_video import Gemma4VideoRule
from dataprep.media_rules.glm4v_video import Glm4vVideoRule
from dataprep.media_rules.internvl_video import INTERNVL_VIDEO_SOURCES, InternVLVideoRule
from dataprep.media_rules.llava_next_video import LlavaNextVideoRule
from dataprep.media_rules.onevision_video import OneVisionVideoRule
from dataprep.media_rules.qwen3_video import QWEN3_VIDEO_SOURCES, Qwen3VideoRule
from dataprep.media_rules.qwen_video import QWEN_VIDEO_SOURCES, QwenVideoRule
from dataprep.media_rules.registry import (
    AUDIO_RULES,
    VIDEO_RULES,
    parse_audio_rule,
    parse_video_rule,
)
from dataprep.media_rules.smolvlm_video import SmolVLMVideoRule
from dataprep.media_rules.whisper_audio import WhisperAudioRule, audio_tokens
from dataprep.media_rules.whisper_windows import WhisperWindowsRule

__all__ = [
    "AUDIO_RULES",
    "INTERNVL_VIDEO_SOURCES",
    "QWEN3_VIDEO_SOURCES",
    "QWEN_VIDEO_SOURCES",
    "VIDEO_RULES",
    "ErnieVideoRule",
    "Gemma4AudioRule",
    "Gemma4VideoRule",
    "Glm4vVideoRule",
    "InternVLVideoRule",
    "LlavaNextVideoRule",
    "MediaCost",
    "MediaRule",
    "OneVisionVideoRule",
    "Qwen3VideoRule",
    "QwenVideoRule",
    "SmolVLMVideoRule",
    "WhisperAudioRule",
    "WhisperWindowsRule",
    "audio_tokens",
    "parse_audio_rule",
    "parse_video_rule",
]
