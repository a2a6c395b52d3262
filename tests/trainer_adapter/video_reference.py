"""The Qwen, GLM, LLaVA-OneVision, LLaVA-NeXT-Video and InternVL video processors' own outputs,
the reference of HFPacker's videos, in a process of their own.

    python -m tests.trainer_adapter.video_reference REQUESTS.json RESULTS.pt

(a list of requests, one process for all: transformers is imported once.)

The transformers video processors import torchvision, which has no build for this CPU torch
on the registry. Here the real ``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor`` /
``Glm4vVideoProcessor`` / ``LlavaOnevisionVideoProcessor`` / ``LlavaNextVideoVideoProcessor`` /
``InternVLVideoProcessor`` and the real processor
(``Qwen2VLProcessor``, ``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``, ``Glm4vProcessor``,
``LlavaOnevisionProcessor``, ``LlavaNextVideoProcessor``, ``InternVLProcessor``) run: the
processor's call loads each video file (as its default reader, torchcodec, does: every
index its sampler asks, repeated ones too), samples its frames,
resizes, normalizes, patches and writes the prompt, as a user's would. Only torchvision is
replaced, by stub modules (a package record so that transformers takes it as installed) whose
functions the processors call do what torchvision 0.28's code does on a CPU, read from its
source: ``crop`` (LLaVA-NeXT-Video's centre crop, inside the frame: the slice),
``transforms.v2.functional.resize`` (``resize_image``: a tensor of the size asked is
returned as it is; uint8 with bicubic goes to torch's native uint8 ``interpolate``, antialiased,
without corner alignment) and ``normalize`` (``normalize_image``: subtract the mean, divide by
the std, per channel); ``transforms.functional.resize``, which qwen-vl-utils calls
(``_functional_tensor.resize``: float32 ``interpolate``, clamped to 0..255 for bicubic uint8,
rounded, cast back). The qwen-vl-utils source runs its own ``fetch_video`` through a reader
backend that decodes every frame with PyAV and takes its decord reader's frames
(``torch.linspace(0, total - 1, n).round()``), then the processor with ``do_resize=False``
and the metadata qwen-vl-utils returns. The stubs live in this process only.

Qwen2.5-Omni's processor (``Qwen2_5OmniProcessor``) runs the same way, with a Whisper
feature extractor beside (no recording is given) and a video's frames alone (its default).

REQUEST: ``{"model": DIR, "processor": CLASS, "video": {kwargs of the video processor},
"processor_kw": {kwargs of the processor}, "call": {kwargs of the processor call},
"utils": {qwen-vl-utils' element keys} or null,
"patch": 14, "cases": [{"text": TEXT, "videos": [PATH, ...]}]}``. RESULTS: a list a request,
of one dict a case: the processor's outputs as tensors.
"""

from __future__ import annotations

import enum
import json
import sys
import tempfile
from pathlib import Path

import torch


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _resize_v2(image, size, interpolation=InterpolationMode.BILINEAR, antialias=True, **_):
    """torchvision 0.28 ``resize_image`` on a CPU tensor, for the modes the processors use."""
    mode = InterpolationMode(interpolation).value
    h, w = image.shape[-2:]
    if [h, w] == list(size):
        return image
    shape = image.shape
    x = image.reshape(-1, *shape[-3:])
    native = image.dtype in (torch.float32, torch.float64) or (
        image.dtype == torch.uint8 and mode in ("bicubic", "lanczos")
    )
    if not native:
        x = x.float()
    x = torch.nn.functional.interpolate(
        x, size=list(size), mode=mode, align_corners=False, antialias=antialias
    )
    if not native:
        x = x.clamp(0, 255).round().to(image.dtype)
    return x.reshape(*shape[:-2], *size)


def _resize_v1(img, size, interpolation=InterpolationMode.BILINEAR, antialias=True, **_):
    """torchvision 0.28 ``transforms.functional.resize`` of a tensor (``_functional_tensor``)."""
    mode = InterpolationMode(interpolation).value
    if list(img.shape[-2:]) == list(size):
        return img
    dtype = img.dtype
    x = img.float() if dtype not in (torch.float32, torch.float64) else img
    x = torch.nn.functional.interpolate(
        x, size=list(size), mode=mode, align_corners=False, antialias=antialias
    )
    if mode == "bicubic" and dtype == torch.uint8:
        x = x.clamp(min=0, max=255)
    if dtype != x.dtype:
        x = torch.round(x).to(dtype) if not dtype.is_floating_point else x.to(dtype)
    return x


def _normalize(image, mean, std, inplace=False):
    mean = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
    image = image.sub_(mean) if inplace else image.sub(mean)
    return image.div_(std)


def _crop(image, top, left, height, width):
    """torchvision 0.28 ``crop_image`` of a tensor inside its bounds: the slice (the video
    processors crop a frame already resized past the crop)."""
    h, w = image.shape[-2:]
    assert top >= 0 and top + height <= h and left >= 0 and left + width <= w, (h, w)
    return image[..., top : top + height, left : left + width]


def _stub_torchvision() -> None:
    from tests.dataprep.media_reference import _stub_torchvision as stubs

    stubs()
    record = Path(tempfile.mkdtemp()) / "torchvision-0.28.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    sys.path.insert(0, str(record.parent))
    for name in (
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2.functional",
    ):
        sys.modules[name].InterpolationMode = InterpolationMode
    v2 = sys.modules["torchvision.transforms.v2.functional"]
    v2.resize, v2.normalize = _resize_v2, _normalize
    v2.crop = _crop
    v2.grayscale_to_rgb = lambda x: x.expand(*x.shape[:-3], 3, *x.shape[-2:])
    sys.modules["torchvision.transforms.functional"].resize = _resize_v1


def _decoded(path: str):
    """Every frame of the file as ``[n, 3, H, W]`` uint8, and its average frame rate."""
    import av
    import numpy as np

    with av.open(path) as c:
        stream = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(stream)]
        fps = float(stream.average_rate)
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous(), fps


def _read(path: str, sample_indices_fn):
    """A video's sampled frames and metadata as transformers' default reader gives them
    (``read_video_torchcodec``, which has no build for this torch either): the frames at every
    index the sampler asks, a repeated index's frame twice (torchcodec's ``get_frames_at``; GLM's
    sampler repeats the last frame to an even count, and its processor resizes by the frames
    it is given), over every frame PyAV decodes; the metadata as transformers' PyAV reader
    gives it (the stream's frame count and average rate)."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(path) as c:
        stream = c.streams.video[0]
        total, fps = int(stream.frames), float(stream.average_rate)
        height, width = stream.height, stream.width
    meta = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps,
                         video_backend="reference", height=height, width=width)  # fmt: skip
    indices = sample_indices_fn(metadata=meta)
    video, _ = _decoded(path)
    meta.frames_indices = indices
    return video[torch.as_tensor(indices)].permute(0, 2, 3, 1).numpy(), meta


def _utils_videos(paths: list[str], ele: dict, patch: int):
    """qwen-vl-utils' ``fetch_video`` of each file through a PyAV reader with its decord
    reader's frames: the resized frames and the metadata it returns."""
    import qwen_vl_utils.vision_process as v

    def reader(e):
        video, fps = _decoded(e["video"])
        total = len(video)
        n = v.smart_nframes(e, total_frames=total, video_fps=fps)
        idx = torch.linspace(0, total - 1, n).round().long().tolist()
        meta = {"fps": fps, "frames_indices": idx, "total_num_frames": total,
                "video_backend": "reference"}  # fmt: skip
        return video[idx], meta, n / max(total, 1e-6) * fps

    v.VIDEO_READER_BACKENDS["reference"] = reader
    v.get_video_reader_backend = lambda: "reference"
    out = [
        v.fetch_video({"video": p, **ele}, image_patch_size=patch, return_video_metadata=True)
        for p in paths
    ]
    return [video for video, _ in out], [meta for _, meta in out]


def main() -> None:
    request, result = sys.argv[1], sys.argv[2]
    reqs = json.loads(Path(request).read_text())
    _stub_torchvision()
    torch.save([_outputs(req) for req in reqs], result)


def _outputs(req: dict) -> list[dict]:
    """One request's outputs, a dict a case."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(req["model"])
    if "Glm4v" in req["processor"]:
        from transformers.models.glm4v import Glm4vImageProcessorPil

        image_proc, base = Glm4vImageProcessorPil(**req.get("image", {})), tf.Glm4vVideoProcessor
    elif "InternVL" in req["processor"]:
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        image_proc = GotOcr2ImageProcessorPil(**req.get("image", {}))
        base = tf.InternVLVideoProcessor
    elif "LlavaNextVideo" in req["processor"]:
        from transformers.models.llava_next import LlavaNextImageProcessorPil

        image_proc = LlavaNextImageProcessorPil(**req.get("image", {}))
        base = tf.LlavaNextVideoVideoProcessor
    elif "LlavaOnevision" in req["processor"]:
        from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

        image_proc = LlavaOnevisionImageProcessorPil(**req.get("image", {}))
        base = tf.LlavaOnevisionVideoProcessor
    else:
        image_proc = tf.Qwen2VLImageProcessorPil(**req.get("image", {}))
        base = tf.Qwen3VLVideoProcessor if "Qwen3" in req["processor"] else tf.Qwen2VLVideoProcessor

    class VideoProcessor(base):
        """The processor's own, reading files as its default reader does (:func:`_read`)."""

        def fetch_videos(self, url_or_urls, sample_indices_fn=None):
            if isinstance(url_or_urls, list):
                return list(
                    zip(
                        *[self.fetch_videos(u, sample_indices_fn) for u in url_or_urls], strict=True
                    )
                )
            return _read(url_or_urls, sample_indices_fn)

    parts = {"image_processor": image_proc, "tokenizer": tok,
             "video_processor": VideoProcessor(**req["video"])}  # fmt: skip
    if "Omni" in req["processor"]:  # its recordings' extractor (no recording is given here)
        parts["feature_extractor"] = tf.WhisperFeatureExtractor(feature_size=16)
    proc = getattr(tf, req["processor"])(**parts, **req.get("processor_kw", {}))
    out = []
    for case in req["cases"]:
        kw = dict(req["call"])
        videos = case["videos"]
        if req.get("utils") is not None:
            videos, metas = _utils_videos(videos, req["utils"], req["patch"])
            kw |= {"videos_kwargs": {"do_resize": False, "do_sample_frames": False,
                                     "video_metadata": metas}}  # fmt: skip
        if case.get("images"):
            from transformers.image_utils import load_image

            kw["images"] = [load_image(p) for p in case["images"]]
        got = proc(text=[case["text"]], videos=videos, return_tensors="pt", **kw)
        out.append({k: torch.as_tensor(v) for k, v in got.items()
                    if isinstance(v, torch.Tensor) or k == "video_second_per_grid"})  # fmt: skip
    return out


if __name__ == "__main__":
    main()
