"""Video and audio rules by name: ``prep --video-rule qwen2vl:fps=1,max_frames=64`` and
``prep --audio-rule qwen2_5_omni``.

A spec is ``NAME[:key=value,...]``. ``NAME`` is a rule with the defaults of a model's
processor; each option sets one field of its rule, typed as the field is (a whole number, a
number, 0/1 for a switch, a word), and the rule checks the values together.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dataprep.media_rules.base import MediaRule
from dataprep.media_rules.ernie_video import ErnieVideoRule
from dataprep.media_rules.gemma4_audio import Gemma4AudioRule
from dataprep.media_rules.gemma4_video import Gemma4VideoRule
from dataprep.media_rules.glm4v_video import Glm4vVideoRule
from dataprep.media_rules.internvl_video import InternVLVideoRule
from dataprep.media_rules.llava_next_video import LlavaNextVideoRule
from dataprep.media_rules.onevision_video import OneVisionVideoRule
from dataprep.media_rules.qwen3_video import Qwen3VideoRule
from dataprep.media_rules.qwen_video import QwenVideoRule
from dataprep.media_rules.smolvlm_video import SmolVLMVideoRule
from dataprep.media_rules.whisper_audio import WhisperAudioRule
from dataprep.media_rules.whisper_windows import WhisperWindowsRule

__all__ = [
    "AUDIO_RULES",
    "VIDEO_RULES",
    "check_media_rules",
    "measured_phases",
    "media_rules_recorded",
    "parse_audio_rule",
    "parse_video_rule",
]


@dataclass(frozen=True)
class RuleSpec:
    """How a rule name builds its rule: ``cls(**defaults, **options)``; ``help``: its line in
    ``equishard prep --help``. Which model families a video rule is the processor of is said
    by each family (``FamilySpec.video_rules``), its one home."""

    cls: type[MediaRule]
    defaults: dict = field(default_factory=dict)
    help: str = ""


VIDEO_RULES: dict[str, RuleSpec] = {
    "qwen2vl": RuleSpec(
        QwenVideoRule,
        help="Qwen2-VL / Qwen2.5-VL: frames at fps=2 in [4, 768], 2 a patch in time; "
        "source=qwen-vl-utils (process_vision_info, default) or source=transformers "
        "(Qwen2VLVideoProcessor; fps=0 keeps every frame as its do_sample_frames=False does)",
    ),
    "qwen3vl": RuleSpec(
        Qwen3VideoRule,
        help="Qwen3-VL / Qwen3.5: frames at fps=2 in [4, 768] (or num_frames=N), 16-px patches, "
        "'<t seconds>' before each pair of frames; source=transformers (Qwen3VLVideoProcessor, "
        "default: min_pixels/max_pixels are its size.shortest_edge/longest_edge, the budget of "
        "the whole video) or source=qwen-vl-utils (process_vision_info, image_patch_size=16)",
    ),
    "llava-onevision": RuleSpec(
        OneVisionVideoRule,
        help="LLaVA-OneVision / LLaVA-Video: num_frames=32 uniform frames (or fps=F; both 0: "
        "every frame) of 729 SigLIP patches, 196 pooled tokens each + 1",
    ),
    "llava-next-video": RuleSpec(
        LlavaNextVideoRule,
        help="LLaVA-NeXT-Video: num_frames=8 uniform frames (or num_frames=0,fps=F; both 0: "
        "every frame), each a 336-px CLIP square of 576 patches, 144 pooled tokens a frame",
    ),
    "glm4v": RuleSpec(
        Glm4vVideoRule,
        help="GLM-4.1V / 4.5V / 4.6V: frames at fps=2 (up to max_duration=300 s, then that "
        "many spread), pairs of 14-px patches resized under the video's pixel budget, each "
        "pair's second counted as text",
    ),
    "smolvlm": RuleSpec(
        SmolVLMVideoRule,
        help="SmolVLM2: num_frames=64 at most (0: every frame), fps=1, skip_secs=1, one "
        "tile=384 square a frame of tokens_per_tile=81; the intro sentence and 'Frame from "
        "MM:SS:' a frame counted as text",
    ),
    "ernie45vl": RuleSpec(
        ErnieVideoRule,
        help="ERNIE 4.5-VL: every frame (or num_frames=N, or fps=F) within min_frames=16 and "
        "max_frames=180, padded to an even count; each frame resized alone within 299..1196 "
        "28-px blocks and run as its own sequence, pairs of frames merged for the LLM",
    ),
    "gemma4": RuleSpec(
        Gemma4VideoRule,
        help="Gemma 4: num_frames=32 uniform frames (or num_frames=0,fps=F), each resized as "
        "an image within max_soft_tokens=70 pooled tokens and padded to their 630 patch rows, "
        "'MM:SS' before each frame counted as text",
    ),
    "internvl": RuleSpec(
        InternVLVideoRule,
        help="InternVL: num_frames=32 segments of max_tiles=1 448-px tiles, 256 tokens a tile, "
        "'Frame{i}:' a frame; source=internvl (the model card's load_video, default) or "
        "source=transformers (InternVLVideoProcessor; num_frames=0 keeps every frame)",
    ),
}
AUDIO_RULES: dict[str, RuleSpec] = {
    "whisper": RuleSpec(
        WhisperAudioRule,
        help="any Whisper-style encoder: sampling_rate, hop_length, chunk_length (s), "
        "n_window (0: padded window)",
    ),
    "qwen2audio": RuleSpec(
        WhisperAudioRule,
        {"chunk_length": 30, "n_window": 0},
        help="Qwen2-Audio: Whisper features to 30 s, the padded 30-s window in the encoder",
    ),
    "qwen2_5_omni": RuleSpec(
        WhisperAudioRule,
        {"chunk_length": 300, "n_window": 100},
        help="Qwen2.5-Omni: Whisper features to 300 s, the encoder in unpadded 2-s chunks",
    ),
    "whisper-windows": RuleSpec(
        WhisperWindowsRule,
        help="a padded Whisper-style encoder over several windows: sampling_rate, "
        "hop_length, chunk_length (s), max_windows (the rest cut away)",
    ),
    "audioflamingo3": RuleSpec(
        WhisperWindowsRule,
        {"chunk_length": 30, "max_windows": 20},
        help="Audio Flamingo 3: 30-s Whisper windows, at most 20 (600 s), each padded",
    ),
    "gemma4": RuleSpec(
        Gemma4AudioRule,
        help="Gemma 4: 20-ms mel frames every 10 ms to 30 s (max_length=480000 samples), "
        "subsampled 4x, one token a position (40 ms); <|audio> and <audio|> counted as text",
    ),
}


def _parse(spec: str, rules: dict[str, RuleSpec], what: str) -> MediaRule:
    name, _, rest = spec.partition(":")
    entry = rules.get(name)
    if entry is None:
        raise ValueError(f"unknown {what} rule {name!r}: one of {', '.join(rules)}")
    types = {f.name: f.type for f in fields(entry.cls)}
    options: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in types or key in options:
            raise ValueError(
                f"{what} rule {spec!r}: {item!r} is not one of its options "
                f"({', '.join(sorted(types))}), each key=value once"
            )
        kind = types[key]
        try:
            if kind == "int":
                options[key] = int(value)
            elif kind == "float":
                options[key] = float(value)
            elif kind == "bool":
                if value not in ("0", "1"):
                    raise ValueError(value)
                options[key] = value == "1"
            else:
                options[key] = value
        except ValueError:
            raise ValueError(
                f"{what} rule {spec!r}: {key} must be {'0 or 1' if kind == 'bool' else 'a ' + kind}, "
                f"got {value!r}"
            ) from None
    return entry.cls(**{**entry.defaults, **options})


def parse_video_rule(spec: str) -> MediaRule:
    """The video rule a ``--video-rule`` spec names (``ValueError`` with the fix if none)."""
    return _parse(spec, VIDEO_RULES, "video")


def parse_audio_rule(spec: str) -> MediaRule:
    """The audio rule an ``--audio-rule`` spec names."""
    return _parse(spec, AUDIO_RULES, "audio")


def check_media_rules(video: str | None, audio: str | None, vision_policy: str) -> None:
    """Parse both specs (``ValueError`` with the fix), and refuse a rule beside the vision
    policy of another model family: one run measures one model's inputs. A video rule belongs
    to the families that name it (``FamilySpec.video_rules``, their ``video_policies`` where
    not all their models take videos); an audio rule named by families
    (``FamilySpec.audio_rules``) to theirs, and one no family names (the Whisper rules, whose
    models' templates prep renders with its own) to none."""
    if audio:
        parse_audio_rule(audio)
    if video:
        parse_video_rule(video)
    from dataprep.families.registry import rule_owners

    policy = vision_policy.partition(":")[0]
    for spec, what in ((video, "video"), (audio, "audio")):
        if not spec:
            continue
        name = spec.partition(":")[0]
        owners = rule_owners(what, name)
        own = (f.video_policies or f.policies if what == "video" else f.policies for f in owners)
        policies = tuple(dict.fromkeys(p for ps in own for p in ps))
        # an audio-only family (no policy: its template refuses images) takes any policy
        if owners and policies and policy not in policies:
            raise ValueError(
                f"--{what}-rule {name} is the {what} processor of the models of vision policy "
                f"{' or '.join(policies)}, but --vision-policy is {policy}: one prep measures one "
                f"model's inputs. Pass --vision-policy {policies[0]}, or leave "
                f"{'videos' if what == 'video' else 'recordings'} out"
            )


def measured_phases(video: str | None, audio: str | None) -> tuple:
    """The encoder phases a prep with these rules measures (vision always)."""
    from equishard.contracts.phases import AUDIO, VIDEO, VISION

    return (VISION, *((VIDEO,) if video else ()), *((AUDIO,) if audio else ()))


def media_rules_recorded(cfg) -> dict:
    """What a cost table's metadata records of the run's video and audio rules (nothing for a
    run without them: its metadata stays as before)."""
    out = {}
    if cfg.video_rule:
        out["video_rule"] = parse_video_rule(cfg.video_rule).describe()
    if cfg.audio_rule:
        out["audio_rule"] = parse_audio_rule(cfg.audio_rule).describe()
    return out
