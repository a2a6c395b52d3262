"""Audio Flamingo 3: an audio-only family (no vision policy; its template writes no image
marker, so prep refuses a sample with images rendered with it).

Its chat template, in the Qwen2 chat format of its language model, writes ``<sound>`` where a
recording stands; ``AudioFlamingo3Processor`` repeats it once a token of the audio encoder (the
frames of all the recording's 30-s windows, halved by the stem and halved again by the
pooling). Its recordings are measured with ``--audio-rule audioflamingo3`` (at most 20 windows
of 30 s, each padded: :mod:`~dataprep.media_rules.whisper_windows`); the packer gives the
model every window whole, as the processor pads it, with its frame mask
(``input_features_mask``)."""

from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules

SPEC = FamilySpec(
    name="audioflamingo3",
    models="Audio Flamingo 3",
    policies=(),
    template="audioflamingo3",
    image_tokens=None,
    packer=PackerRules(audio="windows", audio_mask="input_features_mask"),
    media_tokens={"audio": ImageTokens("<sound>")},
    # its processor's windows: a one-window Whisper rule would count a long recording as cut
    audio_rules=("audioflamingo3", "whisper-windows"),
)
