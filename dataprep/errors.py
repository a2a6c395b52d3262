"""Errors and rejection reasons of the prep stage.

Two kinds of failure exist. A :class:`DataprepError` stops the run: the input as a whole cannot be
read (a JSON file that is not a list, an unknown format, a bad option). A :class:`SampleRejected`
concerns one sample: the sample goes to the errors table with its reason and the run goes on.
"""

from __future__ import annotations

from equishard.common.errors import EquishardError, describe

__all__ = ["REASONS", "DataprepError", "ErrorRateExceeded", "SampleRejected", "describe"]

# Every reason a sample can be rejected for, with the sentence the summary prints for it.
REASONS: dict[str, str] = {
    "malformed_json": "the record is not valid JSON",
    "not_an_object": "the record is not a JSON object",
    "bad_id": "the sample id is not a string or integer",
    "duplicate_id": "the sample id was already seen earlier in the input",
    "empty_conversation": "the conversation has no turns or no text",
    "non_string_text": "a turn's text is not a string",
    "invalid_text": "the text is not valid Unicode (a lone surrogate) or the tokenizer rejects it",
    "invalid_lengths": "an entry of an imported length file is not a sample's lengths",
    "template_error": "the model's chat template refuses the conversation (raise_exception)",
    "template_limit": "rendering the chat template went past its time or size limit per sample "
    "($EQUISHARD_TEMPLATE_SECONDS, $EQUISHARD_TEMPLATE_CHARS)",
    "template_no_image_family": "the sample has images but the chat template writes no image "
    "marker (a text LLM's template): name the model family with --template PATH#images=FAMILY",
    "template_no_media_marker": "the sample has videos or recordings but the chat template's "
    "family has no video or audio marker prep knows (a family without a video rule)",
    "template_image_mismatch": "the chat template wrote another number of image markers than "
    "the sample has images (a marker typed in the text, or a template that drops images)",
    "assistant_not_rendered": "the chat template changes or drops an assistant turn's text and "
    "has no generation blocks, so the trained tokens cannot be found",
    "too_deep": "the record is nested deeper than the JSON parser allows",
    "record_too_large": "a JSONL line or a tar sample's .json holds more than 256 MiB (never "
    "read whole)",
    "bad_role": "a turn has a role that is not system/user/assistant",
    "image_placeholder_mismatch": "the number of <image> placeholders differs from the images",
    "media_placeholder_mismatch": "the number of <video> or <audio> placeholders differs from "
    "the videos or recordings",
    "unsupported_modality": "the sample carries video or audio, which this run does not measure "
    "(refused, never counted as text; --video-rule and --audio-rule measure them)",
    "unreadable_video": "a video file cannot be opened or its stream has no usable header",
    "no_video_stream": "a video file holds no video stream (an audio-only container)",
    "empty_video": "a video file has zero bytes or its stream no frames",
    "video_too_large": "a video's claimed frame size or frame count is past the safety limit",
    "video_too_short": "a video has fewer frames than the video rule samples (one frame)",
    "unreadable_audio": "an audio file's header cannot be parsed",
    "empty_audio": "an audio file has zero bytes or no samples",
    "audio_too_short": "a recording is too short for the audio rule to give it a token (Gemma 4: "
    "10 ms or less)",
    "audio_out_of_range": "an audio file's sample rate, channels or length is past the limits",
    "probe_limit": "counting a header-less video's packets went past its time or packet bound",
    "unread_media_field": "the images are under a field prep does not read (image_path, img)",
    "missing_image": "an image, video or audio file does not exist",
    "not_a_file": "a media path names a FIFO, device or directory, not a regular file",
    "unsafe_path": "a media path resolves outside --image-root (.., a symlink, an absolute path)",
    "empty_image": "an image file has zero bytes",
    "truncated_image": "an image file ends before its end marker",
    "corrupt_image": "an image file's header cannot be parsed",
    "unsupported_format": "an image, video or audio file is in a format the pipeline does not read",
    "image_too_large": "an image has more pixels than the decoder's safety limit",
    "aspect_ratio_out_of_range": "an image's aspect ratio is outside what the vision policy accepts",
    "unsafe_member": "a tar member has an unsafe name or is not a regular file",
    "duplicate_member": "a tar sample holds the same member twice",
    "missing_text": "a tar sample has no .json member",
    "truncated_archive": "the tar file ends in the middle of this sample",
    "tar_framing": "a damaged tar header (or an over-long member) at this byte range; the samples "
    "beside it may be incomplete",
    "read_error": "the input could not be read at this position",
    "unreadable_record": "the record could not be processed (the detail names the exception)",
}


class DataprepError(EquishardError):
    """A problem with an input or option that stops the prep run."""


class ErrorRateExceeded(DataprepError):
    """More samples were rejected than ``--max-error-rate`` allows."""


class SampleRejected(EquishardError):
    """One sample cannot be measured; it is recorded in the errors table, not raised further."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self):  # travels to worker processes inside work units (tar scans)
        return (SampleRejected, (self.reason, self.detail))
