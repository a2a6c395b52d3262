"""Qwen2-Audio: an audio-only family (no vision policy; its template writes no image marker,
so prep refuses a sample with images rendered with it).

Its chat template writes ``Audio k: <|audio_bos|><|AUDIO|><|audio_eos|>`` and a newline for
the k-th recording; its processor repeats ``<|AUDIO|>`` once a token of the audio encoder (its
features' frames, halved by the stem and halved again by the pooling). Its recordings are
measured with ``--audio-rule qwen2audio`` (Whisper features to 30 s, the padded 30-s window in
the encoder); the packer gives the model every recording's whole window, as the processor
pads it, with its frame mask."""

from dataprep.families.spec import FamilySpec, ImageTokens, PackerRules

SPEC = FamilySpec(
    name="qwen2_audio",
    models="Qwen2-Audio",
    policies=(),
    template="qwen2_audio",
    image_tokens=None,
    packer=PackerRules(audio="window"),
    media_tokens={"audio": ImageTokens("<|AUDIO|>")},
)
