"""Qwen2.5-Omni's thinker: Qwen2.5-VL's images (smart resize to multiples of 28, 14-px patches
merged 2x2) beside Whisper-style recordings, 3-D positions from the thinker's
``get_rope_index`` (which takes each recording's frames too).

Its chat template writes ``<|vision_bos|><|IMAGE|><|vision_eos|>`` for an image and
``<|audio_bos|><|AUDIO|><|audio_eos|>`` for a recording; its processor repeats ``<|IMAGE|>``
``grid.prod() / merge^2`` times and ``<|AUDIO|>`` once a token of the audio encoder (its
features' frames, halved by the stem and halved again by the pooling). The recordings are
measured with a Whisper-style audio rule (``--audio-rule qwen2_5_omni``: features to 300 s,
the encoder in 2-s chunks); the rule is not tied to this family (Qwen2-Audio's processor makes
the same features to 30 s, equishard's own trainer takes either), so the packer checks the
processor's feature extractor against the rule the generation recorded.

Its videos are Qwen2-VL's (its video processor is ``Qwen2VLVideoProcessor``): measured with
``--video-rule qwen2vl:source=transformers,...``, the template writing
``<|vision_bos|><|VIDEO|><|vision_eos|>`` and the processor repeating ``<|VIDEO|>``
``grid.prod() / merge^2`` times. That is the processor's default, a video's frames alone; with
``load_audio_from_video`` (``use_audio_in_video``) it interleaves them with the video's
soundtrack in 2-s chunks, which no rule here measures."""

from dataprep.families.processor_settings import QWEN_CHECKS
from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules

SPEC = FamilySpec(
    name="qwen2_5_omni",
    models="Qwen2.5-Omni (its thinker)",
    policies=("qwen2vl",),  # its image processor is Qwen2-VL's
    template="qwen2_5_omni",
    image_tokens=ImageTokens("<|IMAGE|>"),
    processor_checks=QWEN_CHECKS,
    packer=PackerRules(
        rope_positions=True, beside=("image_grid_thw",), audio="packed", videos=True
    ),
    media_tokens={"audio": ImageTokens("<|AUDIO|>"), "video": ImageTokens("<|VIDEO|>")},
    video_rules=("qwen2vl",),  # its video processor's: frames alone, no soundtrack
)
