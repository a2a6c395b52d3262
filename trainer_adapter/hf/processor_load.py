"""A model's Hugging Face processor for image training, on an install without torchvision.

``AutoProcessor.from_pretrained(MODEL)`` builds every sub-processor the model's processor class
names. For the video-capable families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, ...) that
includes a video processor, which needs torchvision; the README's CPU install (torch 2.13.0,
CPU wheels) has none that works beside it, so the call fails before any image is seen
("Qwen2VLVideoProcessor requires the Torchvision library"). :func:`load_processor` builds the
same processor class from the same files with its image processor and tokenizer (and any other
non-video part) only: its image and text outputs are the full processor's. ``HFPacker``
builds the videos of Qwen2-VL, Qwen2.5-VL and Qwen3-VL without it
(:mod:`~trainer_adapter.hf.video_inputs`); ``video=True`` loads the video processor too, with a
torchvision matching your torch installed (the packer then checks it against the video rule).
"""

from __future__ import annotations

__all__ = ["load_processor"]


def _processor_class(model: str, trust_remote_code: bool):
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    config = transformers.AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    name = PROCESSOR_MAPPING_NAMES.get(config.model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(
            f"{model}: transformers names no processor class for model type "
            f"{config.model_type!r}; build the processor yourself (AutoProcessor.from_pretrained)"
        )
    return cls


def load_processor(model: str, *, video: bool = False, trust_remote_code: bool = False, **kwargs):
    """The processor of ``model`` (a model directory or hub id already in the local cache):
    without its video processor unless ``video``. ``kwargs`` go to ``from_pretrained``."""
    cls = _processor_class(model, trust_remote_code)
    if video:
        return cls.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
    parts = [a for a in cls.get_attributes() if "video" not in a]
    images_only = type(cls.__name__, (cls,), {"get_attributes": classmethod(lambda c: parts)})
    return images_only.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
