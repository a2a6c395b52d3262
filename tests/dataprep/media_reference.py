"""The references the video and audio counts are checked against, run in a process of their own.

    python -m tests.dataprep.media_reference REQUEST.json RESULT.json

Videos: each file is decoded whole with PyAV (every frame: the frame count and frame size a
decoding reader sees, independent of the header equishard reads), then sized by the code of
the references themselves: qwen-vl-utils' ``fetch_video`` (its ``smart_nframes`` and its
per-frame pixel budget, through a reader backend that hands it the decoded count), and the
transformers ``Qwen2VLVideoProcessor``'s ``sample_frames``, ``resize`` and ``patchify``;
InternVL's ``InternVLVideoProcessor.sample_frames`` and ``InternVLProcessor``'s prompt (and the
model cards' ``load_video``, tiles by ``GotOcr2ImageProcessor``). The video processors
import torchvision, which has no build for this CPU torch; it is replaced here by stub modules
whose ``resize`` returns zeros of the size asked for (the sizes are all that is compared).
The stubs live in this process only: the test process never sees them.

Audio: each file is loaded by transformers' own ``load_audio`` (soundfile, then soxr to
16 kHz), then run through ``WhisperFeatureExtractor`` with the processor's settings; the token
count is the processor's formula on the feature mask, the encoder windows Qwen2.5-Omni's
``chunk_and_pad_features`` on the feature lengths.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import sys

import torch


def _stub(name: str):
    module = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec(name, None, is_package=True)
    )

    def missing(attr, _name=name):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def refuse(*args, **kwargs):
            raise NotImplementedError(f"{_name}.{attr} is a stub in the reference process")

        return refuse

    module.__getattr__ = missing
    sys.modules[name] = module
    return module


def _stub_torchvision() -> None:
    tv = _stub("torchvision")
    tv.__version__ = "0.0"
    for sub in (
        "io",
        "transforms",
        "transforms.v2",
        "transforms.v2.functional",
        "transforms.functional",
    ):
        module = _stub(f"torchvision.{sub}")
        parent = sys.modules[f"torchvision.{sub.rpartition('.')[0]}"] if "." in sub else tv
        setattr(parent, sub.rpartition(".")[2], module)

    class InterpolationMode:
        BICUBIC, BILINEAR, NEAREST, LANCZOS = "bicubic", "bilinear", "nearest", "lanczos"
        BOX, HAMMING, NEAREST_EXACT = "box", "hamming", "nearest-exact"

    def resize(x, size, *args, **kwargs):
        return torch.zeros(1).expand(*x.shape[:-2], *size)  # a view: no memory

    for name in ("torchvision.transforms", "torchvision.transforms.v2.functional"):
        sys.modules[name].InterpolationMode = InterpolationMode
    sys.modules["torchvision.transforms.functional"].resize = resize
    sys.modules["torchvision.transforms.v2.functional"].resize = resize


def decoded(path: str) -> dict:
    """Every frame decoded: the count, the decoded frame size, the stream's average rate."""
    import av

    with av.open(path) as c:
        stream = c.streams.video[0]
        n, size = 0, None
        for frame in c.decode(stream):
            n += 1
            size = size or (frame.height, frame.width)
        rate = float(stream.average_rate) if stream.average_rate else None
    return {
        "frames": n,
        "height": size[0] if size else 0,
        "width": size[1] if size else 0,
        "fps": rate,
    }


def _qwen_vl_utils_reader(truth: dict):
    """qwen-vl-utils' ``vision_process`` reading every video as ``truth`` says it is: a reader
    backend that takes ``smart_nframes`` frames at the indices its decord and torchvision
    readers take (``torch.linspace(0, total - 1, n).round()``), no pixels decoded."""
    import qwen_vl_utils.vision_process as v

    def reader(ele):
        n = v.smart_nframes(ele, total_frames=truth["frames"], video_fps=truth["fps"])
        idx = torch.linspace(0, truth["frames"] - 1, n).round().long()
        video = torch.zeros(1).expand(n, 3, truth["height"], truth["width"])
        meta = {"fps": truth["fps"], "frames_indices": idx}
        return video, meta, n / truth["frames"] * truth["fps"]

    v.VIDEO_READER_BACKENDS["reference"] = reader
    v.VIDEO_READER_BACKENDS["torchvision"] = reader  # where it falls back to after an error
    v.get_video_reader_backend = lambda: "reference"
    return v


def qwen_vl_utils_grid(truth: dict, ele: dict) -> list[int] | str:
    v = _qwen_vl_utils_reader(truth)
    try:
        video = v.fetch_video({"video": "file.mp4", **ele})
    except (ValueError, AssertionError) as exc:
        return f"refused: {exc}"
    n, _, h, w = video.shape
    return [n // 2, h // 14, w // 14]


def transformers_grid(truth: dict, opts: dict) -> list[int] | str:
    from transformers.image_processing_utils import SizeDict
    from transformers.models.qwen2_vl import video_processing_qwen2_vl as q
    from transformers.video_utils import VideoMetadata

    cls = q.Qwen2VLVideoProcessor
    proc = object.__new__(cls)  # its __init__ asks for torchvision; these methods read these
    for k in (
        "num_frames",
        "fps",
        "temporal_patch_size",
        "min_frames",
        "max_frames",
        "max_video_tokens",
    ):
        setattr(proc, k, opts.get(k, getattr(cls, k, None)))
    meta = VideoMetadata(
        total_num_frames=truth["frames"],
        fps=truth["fps"],
        width=truth["width"],
        height=truth["height"],
    )
    fps = opts.get("fps", 2.0)
    try:
        n = len(cls.sample_frames(proc, meta, fps=fps)) if fps else truth["frames"]
    except (ValueError, ZeroDivisionError, RuntimeError) as exc:
        return f"refused: {exc}"
    if n == 0:
        return "refused: no frame sampled"
    video = torch.zeros(1).expand(1, n, 3, truth["height"], truth["width"])
    size = SizeDict(shortest_edge=128 * 28 * 28, longest_edge=opts.get("max_pixels", 768 * 28 * 28))
    video = cls.resize(
        proc,
        videos=video,
        size=size,
        resample=None,
        factor=28,
        temporal_factor=2,
        cap_pixels_per_frame=opts.get("cap", False),
        max_video_tokens=128000,
    )
    # patchify's grid (it pads the frames to a multiple of 2 by repeating the last one)
    h, w = video.shape[-2:]
    return [-(-n // 2), h // 14, w // 14]


def onevision_tokens(truth: dict, opts: dict) -> list[int] | str:
    """[frames, LLM tokens] as transformers samples (``default_sample_indices_fn``) and counts
    (``LlavaOnevisionProcessor._get_num_multimodal_tokens``, 729 patches a frame) a video."""
    from transformers.models.llava_onevision.processing_llava_onevision import (
        LlavaOnevisionProcessor,
    )
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    meta = VideoMetadata(total_num_frames=truth["frames"], fps=truth["fps"])
    try:
        n = len(
            default_sample_indices_fn(
                meta, num_frames=opts.get("num_frames") or None, fps=opts.get("fps") or None
            )
        )
    except ValueError as exc:
        return f"refused: {exc}"
    proc = object.__new__(LlavaOnevisionProcessor)
    proc.num_image_tokens = 729
    tokens = proc._get_num_multimodal_tokens(video_sizes=[(n, 384, 384)])["num_video_tokens"][0]
    return [n, tokens]


def _qwen3_text(grid: list[int], indices, fps: float) -> str:
    """``Qwen3VLProcessor.replace_video_token``'s text for a video of ``grid`` sampled at
    ``indices``, its video tokens taken out."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    writer = object.__new__(Qwen3VLProcessor)
    writer.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    writer.vision_start_token, writer.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    writer.video_token = "<|video_pad|>"
    meta = VideoMetadata(total_num_frames=max(indices) + 1, fps=fps, frames_indices=indices)
    text = writer.replace_video_token(
        {"video_grid_thw": torch.tensor([grid]), "video_metadata": [meta]}, 0
    )
    return text.replace("<|video_pad|>", "")


def qwen3_video(truth: dict, opts: dict) -> list | str:
    """[grid t, h, w, prompt text]: ``source=transformers`` as ``Qwen3VLVideoProcessor``
    samples (``sample_frames``), resizes (its ``resize``, Qwen3-VL's ``smart_resize``) and
    patchifies; ``source=qwen-vl-utils`` as ``fetch_video(..., image_patch_size=16)`` through a
    reader that indexes frames as its decord and torchvision readers do."""
    if opts.get("source") == "qwen-vl-utils":
        v = _qwen_vl_utils_reader(truth)
        ele = {k: a for k, a in opts.items() if k != "source"}
        try:
            video, meta = v.fetch_video(
                {"video": "file.mp4", **ele}, image_patch_size=16, return_video_metadata=True
            )
        except (ValueError, AssertionError) as exc:
            return f"refused: {exc}"
        n, _, h, w = video.shape
        grid = [n // 2, h // 16, w // 16]
        return [*grid, _qwen3_text(grid, meta["frames_indices"].tolist(), truth["fps"])]
    from transformers.image_processing_utils import SizeDict
    from transformers.models.qwen3_vl import video_processing_qwen3_vl as q
    from transformers.video_utils import VideoMetadata

    cls = q.Qwen3VLVideoProcessor
    proc = object.__new__(cls)
    for k in (
        "num_frames",
        "fps",
        "temporal_patch_size",
        "min_frames",
        "max_frames",
        "max_video_tokens",
    ):
        setattr(proc, k, opts.get(k, getattr(cls, k, None)))
    meta = VideoMetadata(
        total_num_frames=truth["frames"],
        fps=truth["fps"],
        width=truth["width"],
        height=truth["height"],
    )
    try:
        idx = cls.sample_frames(proc, meta, num_frames=opts.get("num_frames"))
        n = len(idx)
        video = torch.zeros(1).expand(1, n, 3, truth["height"], truth["width"])
        size = SizeDict(
            shortest_edge=opts.get("min_pixels", 128 * 32 * 32),
            longest_edge=opts.get("max_pixels", 768 * 32 * 32),
        )
        video = cls.resize(
            proc,
            videos=video,
            size=size,
            resample=None,
            factor=32,
            temporal_factor=2,
            cap_pixels_per_frame=opts.get("cap", False),
            max_video_tokens=opts.get("max_video_tokens", 768),
        )
    except (ValueError, ZeroDivisionError, RuntimeError) as exc:
        return f"refused: {exc}"
    h, w = video.shape[-2:]
    grid = [-(-n // 2), h // 16, w // 16]
    return [*grid, _qwen3_text(grid, idx.tolist(), truth["fps"])]


def _model_card_indices(max_frame: int, fps: float, num_segments: int) -> list[int]:
    """The InternVL model cards' ``get_index`` with ``bound=None`` (transcribed: the function
    is published in the cards, in no package): one frame from the middle of each segment."""
    import numpy as np

    start, end = -100000, 100000
    start_idx = max(0, round(start * fps))
    end_idx = min(round(end * fps), max_frame)
    seg_size = float(end_idx - start_idx) / num_segments
    return [
        int(start_idx + (seg_size / 2) + np.round(seg_size * idx)) for idx in range(num_segments)
    ]


@functools.lru_cache
def _tiles(width: int, height: int, max_tiles: int) -> int:
    from PIL import Image
    from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

    ip = GotOcr2ImageProcessorPil(
        crop_to_patches=True,
        min_patches=1,
        max_patches=max_tiles,
        size={"height": 448, "width": 448},
    )
    blank = Image.new("RGB", (width, height))
    return int(ip(images=[blank], return_tensors="np")["num_patches"][0])


def internvl_video(truth: dict, opts: dict) -> list | str:
    """[frames, tiles a frame, the text the processor writes without its context tokens]:
    ``source=transformers`` as ``InternVLVideoProcessor.sample_frames`` samples and
    ``InternVLProcessor.replace_video_token`` writes; ``source=internvl`` as the model card's
    ``load_video`` (``get_index``, then ``GotOcr2ImageProcessor``'s ``crop_to_patches``, the
    transformers form of ``dynamic_preprocess``, on each frame) and its prompt."""
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    total, rate = truth["frames"], truth["fps"]
    tiles = 1
    if opts.get("source") == "internvl":
        n = len(_model_card_indices(total - 1, rate, opts["num_frames"]))
        if opts.get("max_tiles", 1) > 1:
            tiles = _tiles(truth["width"], truth["height"], opts["max_tiles"])
        text = "".join(f"Frame{i + 1}: <image>\n" for i in range(n))
        return [n, tiles, text.replace("<image>", "<img></img>")]
    from transformers.models.internvl.video_processing_internvl import InternVLVideoProcessor
    from transformers.video_utils import VideoMetadata

    cls = InternVLVideoProcessor
    proc = object.__new__(cls)
    proc.num_frames, proc.fps, proc.initial_shift = None, None, opts.get("initial_shift", True)
    meta = VideoMetadata(total_num_frames=total, fps=rate)
    if opts.get("num_frames") or opts.get("fps"):
        try:
            n = len(
                cls.sample_frames(
                    proc, meta, num_frames=opts.get("num_frames") or None, fps=opts.get("fps")
                )
            )
        except (ValueError, ZeroDivisionError, RuntimeError) as exc:
            return f"refused: {exc}"
    else:
        n = total
    writer = object.__new__(InternVLProcessor)
    writer.start_image_token, writer.end_image_token = "<img>", "</img>"
    # one context token a frame here (the checkpoints' 256 would make a 30-minute video's
    # prompt 180 MB): the count a frame is the image policy's, the text is what is compared
    writer.image_token, writer.image_seq_length = "<IMG_CONTEXT>", 1
    text = writer.replace_video_token({"pixel_values_videos": [torch.zeros(n)]}, 0)
    if text.count("<IMG_CONTEXT>") != n:
        return "refused: a frame without its context token"
    return [n, tiles, text.replace("<IMG_CONTEXT>", "")]


@functools.lru_cache(maxsize=1)
def _loaded(path: str):
    """One file's samples at 16 kHz by transformers' ``load_audio``: loaded once for all the
    settings a request asks of it (the settings follow one another per file)."""
    from transformers.audio_utils import load_audio

    return load_audio(path, sampling_rate=16000, backend="soundfile")


def audio_reference(path: str, chunk_length: int, n_window: int) -> dict:
    """The processor's counts for one file: its samples at 16 kHz, the feature frames of the
    mask, the LLM tokens (the processor's formula), the encoder windows."""
    import numpy as np
    from transformers.models.whisper.feature_extraction_whisper import WhisperFeatureExtractor

    wave = _loaded(path)
    fe = WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length)
    out = fe(
        [wave],
        sampling_rate=16000,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="np",
    )
    frames = int(np.asarray(out["attention_mask"]).sum(-1)[0])
    tokens = (((frames - 1) // 2 + 1) - 2) // 2 + 1
    if n_window:
        import torch.nn.functional as F  # noqa: F401  (the model module needs it loaded)
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features

        feats = torch.zeros(128, frames)
        _, chunks = chunk_and_pad_features(feats, torch.tensor([frames]), n_window)
        windows = [(c - 1) // 2 + 1 for c in chunks.tolist()]
    else:
        windows = [int(np.asarray(out["input_features"]).shape[-1]) // 2]
    return {"samples": len(wave), "frames": frames, "tokens": tokens, "windows": windows}


_VIDEO_REFERENCES = {
    "qwen_vl_utils": qwen_vl_utils_grid,
    "transformers": transformers_grid,
    "onevision": onevision_tokens,
    "internvl": internvl_video,
    "qwen3": qwen3_video,
}


def _video_entry(item: dict, truth: dict) -> dict:
    """Every reference the request asks of one video, by the names it gives them."""
    return {
        name: reference(truth, opts)
        for kind, reference in _VIDEO_REFERENCES.items()
        for name, opts in item.get(kind, {}).items()
    }


def internvl_indices(item: dict) -> list | str:
    """The frames InternVL's loaders hand the model: the model card's ``get_index``, or
    ``InternVLVideoProcessor.sample_frames`` (every frame without num_frames and fps)."""
    total, rate, opts = item["total"], item["fps"], item["opts"]
    if opts.get("source", "internvl") == "internvl":
        return _model_card_indices(total - 1, rate, opts.get("num_frames", 32))
    from transformers.models.internvl.video_processing_internvl import InternVLVideoProcessor
    from transformers.video_utils import VideoMetadata

    if not opts.get("num_frames") and not opts.get("fps"):
        return list(range(total))
    proc = object.__new__(InternVLVideoProcessor)
    proc.num_frames, proc.fps = None, None
    proc.initial_shift = bool(opts.get("initial_shift", 1))
    meta = VideoMetadata(total_num_frames=total, fps=rate)
    try:
        idx = InternVLVideoProcessor.sample_frames(
            proc, meta, num_frames=opts.get("num_frames") or None, fps=opts.get("fps") or None
        )
    except (ValueError, ZeroDivisionError, RuntimeError) as exc:
        return f"refused: {exc}"
    return [int(i) for i in idx]


def main() -> None:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    _stub_torchvision()
    result = {"videos": {}, "audios": {}, "synthetic": [], "indices": []}
    for item in request.get("videos", []):
        truth = decoded(item["path"])
        result["videos"][item["path"]] = {"truth": truth, **_video_entry(item, truth)}
    for item in request.get("synthetic", []):  # headers without files: a grid of metadata
        result["synthetic"].append(_video_entry(item, item["truth"]))
    for item in request.get("indices", []):
        result["indices"].append(internvl_indices(item))
    for item in request.get("audios", []):
        result["audios"][item["path"]] = {
            name: audio_reference(item["path"], *args) for name, args in item["settings"].items()
        }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
