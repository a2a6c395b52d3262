"""HFPacker's videos (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) against the model's own processors.

The reference runs in a process of its own (:mod:`tests.trainer_adapter.video_reference`): the
real video processor and processor of each model, reading each file with transformers' PyAV
reader and sampling, resizing, normalizing and patching its frames, or for the qwen-vl-utils
source qwen-vl-utils' own ``fetch_video`` first; torchvision's two calls done as its 0.28 code
does them on a CPU. For each family and source, over real clips of several sizes (one
portrait) and frame rates, a sample with one video, with two, with an image before a video:

* the ids equal the processor's (each video's ``<|video_pad|>`` tokens; Qwen3-VL's time before
  each pair of frames, the template's wrapper collapsed), the patches and grids equal its
  ``pixel_values_videos`` and ``video_grid_thw`` exactly;
* the positions equal the model's ``get_rope_index`` over the processor's ids, token types and
  grids (Qwen2.5-VL: with the processor's ``second_per_grid_ts``);
* labels are the answer's tokens only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.dataprep.test_jinja_template import make_model_dir, write_image
from tests.sweeps import sweep

tf = pytest.importorskip("transformers")
pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[2]
QWEN2 = "qwen2vl:min_pixels=3136,max_pixels=50176,min_frames=2"
QWEN3 = "qwen3vl:min_pixels=4096,min_frames=2"
# (processor, family, rule): every source of every rule, Qwen2.5-VL with its per-frame cap
CASES = {
    "qwen2vl-transformers": ("Qwen2VLProcessor", "qwen2vl", f"{QWEN2},source=transformers"),
    "qwen2vl-utils": ("Qwen2VLProcessor", "qwen2vl", f"{QWEN2},source=qwen-vl-utils"),
    "qwen2_5vl-capped": (
        "Qwen2_5_VLProcessor",
        "qwen2vl",
        f"{QWEN2},source=transformers,fps=1.5,cap_pixels_per_frame=1,max_video_tokens=400",
    ),
    "qwen3vl-transformers": ("Qwen3VLProcessor", "qwen3vl", f"{QWEN3},max_pixels=262144"),
    "qwen3vl-utils": (
        "Qwen3VLProcessor",
        "qwen3vl",
        f"{QWEN3},source=qwen-vl-utils,max_pixels=65536,fps=1",
    ),
    # GLM-4.1V: a budget that shrinks the longer clips; a longest duration shorter than most
    # clips (frames spread over the whole video) at another rate
    "glm4v": ("Glm4vProcessor", "glm4v", "glm4v:max_pixels=401408"),
    "glm4v-long": ("Glm4vProcessor", "glm4v", "glm4v:max_pixels=301056,max_duration=3,fps=1.5"),
}


def _videos(root: Path) -> list[str]:
    from dataprep.demo_media import write_videos

    return write_videos(root, np.random.default_rng(5), 4)


def _records(root: Path) -> list[dict]:
    """A video alone, two videos, an image then a video, a video after text."""
    clips = _videos(root)
    image = write_image(root / "img" / "a.png", 300, 200, "PNG", 1)
    q = "What happens here?"
    return [
        {"turns": [("user", f"<video>\n{q}"), ("assistant", "Rain falls.")], "videos": clips[:1]},
        {
            "turns": [("user", f"<video><video>{q}"), ("assistant", "Two cars.")],
            "videos": clips[1:3],
        },
        {
            "turns": [("user", f"<image>\n<video>\n{q}"), ("assistant", "A bird.")],
            "videos": clips[3:4],
            "images": [str(image.relative_to(root))],
        },
        {
            "turns": [("user", f"{q} <video>"), ("assistant", "Nothing at all.")],
            "videos": clips[2:3],
        },
    ]


def _processor(cls_name: str, model_dir: Path, rule, policy: str | None = None):
    """The model's processor as a CPU user loads it: no video processor (it needs
    torchvision); ``policy``: its image processor's pixel bounds that vision policy's."""
    from transformers.models.glm4v import Glm4vImageProcessorPil
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    mean = [0.5] * 3 if "Qwen3" in cls_name else None  # Qwen3-VL's configs
    kw = {"image_mean": mean, "image_std": mean} if mean else {}
    if policy:
        kw |= {k: int(v) for k, v in (o.split("=") for o in policy.split(":")[1].split(","))}
    images = Glm4vImageProcessorPil if "Glm4v" in cls_name else Qwen2VLImageProcessorPil
    if policy and images is Glm4vImageProcessorPil:  # its bounds as its size
        kw["size"] = {"shortest_edge": kw.pop("min_pixels"), "longest_edge": kw.pop("max_pixels")}
    ip = images(patch_size=rule.patch_size, merge_size=2, **kw)
    cls = type(
        cls_name,
        (getattr(tf, cls_name),),
        {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])},
    )
    return cls(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template)


def _rope_index(cls_name: str, tok):
    """A tiny model's ``get_rope_index`` with the tokenizer's vision token ids."""
    from tests.trainer_adapter.test_hf_inputs import _rope_index as glm_or_qwen
    from tests.trainer_adapter.test_hf_inputs import _vision_token_ids

    if cls_name == "Glm4vProcessor":
        return glm_or_qwen("glm4v", SimpleNamespace(tokenizer=tok))

    ids = _vision_token_ids(tok)
    text = dict(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    if cls_name == "Qwen3VLProcessor":
        rope = {
            "rope_type": "default",
            "rope_theta": 1e4,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        }
        cfg = tf.Qwen3VLConfig(
            text_config={**text, "head_dim": 8, "rope_parameters": rope},
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=16,
                num_heads=2,
                patch_size=16,
                out_hidden_size=16,
            ),
            **ids,
        )
        return tf.Qwen3VLModel(cfg).get_rope_index
    rope = {"type": "mrope", "mrope_section": [2, 1, 1]}
    config, model = (
        (tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLModel)
        if cls_name == "Qwen2_5_VLProcessor"
        else (tf.Qwen2VLConfig, tf.Qwen2VLModel)
    )
    cfg = config(
        text_config={**text, "rope_scaling": rope},
        vision_config=dict(depth=1, hidden_size=16, num_heads=2),
        **ids,
    )
    return model(cfg).get_rope_index


def _cache() -> Path | None:
    """Where the references are kept between runs: ``EQUISHARD_TEST_CACHE`` (the mutation tool
    sets it for its run's mutants: each reference computed once); none otherwise (a test run
    computes them, about 150 MB it would otherwise leave behind)."""
    where = os.environ.get("EQUISHARD_TEST_CACHE")
    if not where:
        return None
    cache = Path(where) / "video-reference"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _cache_key(request: dict) -> str:
    """What the reference's outputs depend on: the request with every file by its bytes' hash,
    the reference's code and the transformers and torch versions."""
    import hashlib

    def digest(path: str) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    cases = [
        {
            **c,
            "videos": [digest(v) for v in c["videos"]],
            "images": [digest(i) for i in c["images"]],
        }
        for c in request["cases"]
    ]
    model = Path(request["model"])
    key = {**request, "cases": cases, "model": [digest(str(model / f)) for f in
           ("tokenizer.json", "tokenizer_config.json")], "code": digest(
           ROOT / "tests" / "trainer_adapter" / "video_reference.py"),
           "versions": [tf.__version__, torch.__version__]}  # fmt: skip
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _request(cls_name: str, rule, model_dir: Path, cases: list[dict]) -> dict:
    """The reference request of the processor's outputs for ``cases`` (text, video and image
    paths), for :mod:`tests.trainer_adapter.video_reference`."""
    from dataprep.media_rules import Glm4vVideoRule

    glm = isinstance(rule, Glm4vVideoRule)
    size = {"shortest_edge": rule.min_pixels}
    factor = rule.patch_size * rule.merge_size
    if glm or rule.source == "transformers":
        size["longest_edge"] = rule.max_pixels or 768 * factor * factor
    video = {
        "size": size,
        "patch_size": rule.patch_size,
        "merge_size": rule.merge_size,
        "temporal_patch_size": rule.temporal_patch_size,
    }
    if glm:
        video |= {"fps": rule.fps, "max_duration": rule.max_duration}
    else:
        video |= {
            "min_frames": rule.min_frames,
            "max_frames": rule.max_frames,
            "cap_pixels_per_frame": rule.cap_pixels_per_frame,
            "max_video_tokens": rule.max_video_tokens,
        }
    if "Qwen3" in cls_name:
        video |= {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    image = {
        "patch_size": rule.patch_size,
        "merge_size": 2,
        **({"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if "Qwen3" in cls_name else {}),
    }
    utils = None
    call = {"fps": rule.fps, "do_sample_frames": True}
    if not glm and rule.source == "qwen-vl-utils":
        utils = {
            "fps": rule.fps,
            "min_pixels": rule.min_pixels,
            "min_frames": rule.min_frames,
            "max_frames": rule.max_frames,
            "total_pixels": rule.total_pixels,
        }
        if rule.max_pixels:
            utils["max_pixels"] = rule.max_pixels
        call = {}
    request = {
        "model": str(model_dir),
        "processor": cls_name,
        "video": video,
        "image": image,
        "call": call,
        "utils": utils,
        "patch": rule.patch_size,
        "cases": cases,
    }
    return request


def _run_references(root: Path, requests: list[dict], cache: Path | None) -> list[list]:
    """Run :mod:`tests.trainer_adapter.video_reference` on ``requests``, in one process (or
    take each one's kept outputs from ``cache``)."""
    kept = [cache / f"{_cache_key(r)}.pt" if cache is not None else None for r in requests]
    todo = [i for i, k in enumerate(kept) if k is None or not k.exists()]
    got = {}
    if todo:
        req, out = root / "requests.json", root / "results.pt"
        req.write_text(json.dumps([requests[i] for i in todo]))
        run = subprocess.run(
            [sys.executable, "-m", "tests.trainer_adapter.video_reference", str(req), str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        got = dict(zip(todo, torch.load(out), strict=True))
        for i in todo:
            if kept[i] is not None:  # whole or not at all: written aside, renamed into place
                part = kept[i].with_suffix(f".part-{os.getpid()}")
                torch.save(got[i], part)
                os.replace(part, kept[i])
    return [got[i] if i in got else torch.load(kept[i]) for i in range(len(requests))]


OMNI_FPS = (2.0, 1.5)
# LLaVA-OneVision / LLaVA-Video: its released 384-px SigLIP tiles, 8 and 4 frames a video
ONEVISION = {"onevision-8": "llava-onevision:num_frames=8",
             "onevision-4": "llava-onevision:num_frames=4"}  # fmt: skip


NEXT = {"next-video-8": "llava-next-video:num_frames=8"}  # the model cards' 8 frames
# InternVL's -hf checkpoints: 8 frames from the middle of each step, or 6 from its start (not
# by the second: its processor cannot stack a call's videos of other frame counts)
INTERNVL = {"internvl-8": "internvl:source=transformers,num_frames=8",
            "internvl-unshifted": "internvl:source=transformers,num_frames=6,initial_shift=0"}  # fmt: skip


def _internvl_request(rule, model_dir: Path, cases: list[dict]) -> dict:
    """The request of ``InternVLProcessor``'s outputs: its image processor as
    :func:`~tests.dataprep.test_jinja_template.processor_for` makes it, its video processor at
    the rule's tile and shift, its call sampling the rule's frames."""
    call = {"do_sample_frames": True, "initial_shift": rule.initial_shift}
    call |= {"num_frames": rule.num_frames} if rule.num_frames else {"fps": rule.fps}
    return {
        "model": str(model_dir),
        "processor": "InternVLProcessor",
        "video": {"size": {"height": rule.tile_size, "width": rule.tile_size}},
        "image": {
            "crop_to_patches": True,
            "min_patches": 1,
            "max_patches": 12,
            "size": {"height": 448, "width": 448},
        },
        "processor_kw": {"image_seq_length": rule.tokens_per_tile},
        "call": call,
        "utils": None,
        "patch": rule.patch_size,
        "cases": cases,
    }


def _next_video_dir(root: Path, tokenizer_path: str) -> Path:
    """LLaVA-NeXT's tokenizer (with ``<video>``) and LLaVA-NeXT-Video's chat template."""
    mdir = make_model_dir(root, "llava_next", tokenizer_path)
    config = json.loads((mdir / "tokenizer_config.json").read_text())
    config["chat_template"] = (ROOT / "examples" / "chat_templates" /
                               "llava_next_video.jinja").read_text()  # fmt: skip
    (mdir / "tokenizer_config.json").write_text(json.dumps(config))
    return mdir


def _next_request(rule, model_dir: Path, cases: list[dict]) -> dict:
    """The request of ``LlavaNextVideoProcessor``'s outputs: llava-v1.6's image settings (CLIP
    336/14), its video processor at the rule's tile, its call sampling ``num_frames``."""
    tile = {"height": rule.image_size, "width": rule.image_size}
    return {
        "model": str(model_dir),
        "processor": "LlavaNextVideoProcessor",
        "video": {"size": {"shortest_edge": rule.image_size}, "crop_size": tile},
        "image": {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}},
        "processor_kw": {
            "patch_size": rule.patch_size,
            "vision_feature_select_strategy": "default",
            "num_additional_image_tokens": 1,
        },
        "call": {"num_frames": rule.num_frames, "do_sample_frames": True},
        "utils": None,
        "patch": rule.patch_size,
        "cases": cases,
    }


def _onevision_request(rule, model_dir: Path, cases: list[dict]) -> dict:
    """The request of ``LlavaOnevisionProcessor``'s outputs: the released models' settings
    (as :func:`~tests.dataprep.test_jinja_template.processor_for` makes the processor), its
    call sampling ``num_frames`` frames a video."""
    return {
        "model": str(model_dir),
        "processor": "LlavaOnevisionProcessor",
        "video": {"size": {"height": rule.image_size, "width": rule.image_size}},
        "image": {},
        "processor_kw": {
            "num_image_tokens": (rule.image_size // rule.patch_size) ** 2,
            "vision_feature_select_strategy": "full",
            "vision_aspect_ratio": "anyres_max_9",
        },
        "call": {"num_frames": rule.num_frames, "do_sample_frames": True},
        "utils": None,
        "patch": rule.patch_size,
        "cases": cases,
    }


def _omni_spec(fps: float) -> str:
    """Qwen2.5-Omni's rule: the pixel bounds its processor's call passes its video processor
    (its class defaults)."""
    return (
        f"qwen2vl:min_frames=2,source=transformers,fps={fps:g},min_pixels=100352,max_pixels=602112"
    )


def _omni_request(root: Path, fps: float, records: list[dict]) -> tuple[dict, object, Path]:
    from importlib import resources

    from dataprep.media_rules import parse_video_rule
    from tests.trainer_adapter.test_hf_omni_inputs import model_dir, processor

    rule = parse_video_rule(_omni_spec(fps))
    with resources.as_file(resources.files("dataprep") / "assets" / "demo_tokenizer.json") as p:
        mdir = model_dir(root / f"omni-{fps:g}", str(p))
    proc = processor(mdir)
    video = {
        "size": {"shortest_edge": rule.min_pixels, "longest_edge": rule.max_pixels},
        "min_frames": rule.min_frames,
        "cap_pixels_per_frame": False,
    }
    request = {
        "model": str(mdir),
        "processor": "Qwen2_5OmniProcessor",
        "video": video,
        "image": {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64},
        "call": {"fps": fps, "do_sample_frames": True},
        "utils": None,
        "patch": 14,
        "cases": _texts(proc, root, records),
    }
    return request, proc, mdir


def _texts(proc, root: Path, records: list[dict]) -> list[dict]:
    """Each record as the processor's call takes it: the template's text, its files."""
    from dataprep.jinja_template import messages_from_turns

    return [
        {
            "text": proc.apply_chat_template(messages_from_turns(r["turns"]), tokenize=False),
            "videos": [str(root / v) for v in r["videos"]],
            "images": [str(root / i) for i in r.get("images", ())],
        }
        for r in records
    ]


@pytest.fixture(scope="module")
def processor_refs(tmp_path_factory, tokenizer_path):
    """For every case (and Qwen2.5-Omni at each rate): the processor, its model directory and
    the processor's outputs for the records, all from one reference process."""
    from dataprep.media_rules import parse_video_rule

    root = tmp_path_factory.mktemp("video-refs")
    records = _records(root)
    made, requests = {}, []
    for case, (cls_name, family, spec) in CASES.items():
        rule = parse_video_rule(spec)
        # Qwen's template and tokens (GLM's for GLM-4.1V)
        mdir = make_model_dir(root / case, "glm4v" if family == "glm4v" else "qwen2vl",
                              tokenizer_path)  # fmt: skip
        proc = _processor(cls_name, mdir, rule)
        made[case] = (proc, mdir)
        requests.append(_request(cls_name, rule, mdir, _texts(proc, root, records)))
    for case, spec in ONEVISION.items():
        from tests.dataprep.test_jinja_template import processor_for

        mdir = make_model_dir(root / case, "llava_onevision", tokenizer_path)
        proc = processor_for("llava_onevision", mdir)
        made[case] = (proc, mdir)
        requests.append(_onevision_request(parse_video_rule(spec), mdir,
                                           _texts(proc, root, records)))  # fmt: skip
    for case, spec in INTERNVL.items():
        from tests.dataprep.test_jinja_template import processor_for

        mdir = make_model_dir(root / case, "internvl", tokenizer_path)
        proc = processor_for("internvl", mdir)
        made[case] = (proc, mdir)
        requests.append(_internvl_request(parse_video_rule(spec), mdir,
                                          _texts(proc, root, records)))  # fmt: skip
    for case, spec in NEXT.items():
        from tests.dataprep.test_jinja_template import processor_for

        mdir = _next_video_dir(root / case, tokenizer_path)
        proc = processor_for("llava_next", mdir)  # its images' processor: no torchvision
        made[case] = (proc, mdir)
        requests.append(_next_request(parse_video_rule(spec), mdir, _texts(proc, root, records)))
    for fps in OMNI_FPS:
        request, proc, mdir = _omni_request(root, fps, records)
        made[f"omni-{fps:g}"] = (proc, mdir)
        requests.append(request)
    refs = _run_references(root, requests, _cache())
    return root, records, {k: (*m, r) for (k, m), r in zip(made.items(), refs, strict=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_packer_videos_equal_the_processor(case, processor_refs):
    from trainer_adapter.hf.inputs import HFPacker

    root, records, made = processor_refs
    cls_name, family, spec = CASES[case]
    proc, model_dir, refs = made[case]
    rope_index = _rope_index(cls_name, proc.tokenizer)
    packer = HFPacker(
        family=family,
        processor=proc,
        template=str(model_dir),
        rope_index=rope_index,
        video_rule=spec,
    )
    tok = proc.tokenizer
    for rec, ref in zip(records, refs, strict=True):
        got = packer.sample(
            rec["turns"],
            [(root / i).read_bytes() for i in rec.get("images", ())],
            video_bytes=[(root / v).read_bytes() for v in rec["videos"]],
        )
        ids = ref["input_ids"][0]
        assert got["input_ids"].tolist() == ids.tolist(), case
        pix = torch.cat([v["patches"] for v in got["videos"]])
        grid = torch.tensor([list(v["grid"]) for v in got["videos"]])
        assert torch.equal(grid, ref["video_grid_thw"])
        assert torch.equal(pix, ref["pixel_values_videos"])
        images = ref["pixel_values"] if rec.get("images") else ref["pixel_values_videos"][:0]
        if family == "glm4v":  # each pair among the images, in the order they stand (after)
            t, h, w = ref["video_grid_thw"].T
            pairs = torch.stack([torch.ones_like(t), h, w], 1).repeat_interleave(t, 0)
            images = torch.cat([images, ref["pixel_values_videos"]])
            have = ref.get("image_grid_thw", pairs[:0])
            assert torch.equal(got["image_grid_thw"], torch.cat([have, pairs]))
        if len(images):
            assert torch.equal(got["pixel_values"], images)
        kw = {}
        if "second_per_grid_ts" in ref:
            kw["second_per_grid_ts"] = ref["second_per_grid_ts"]
        rope, _ = rope_index(
            ids[None],
            ref["mm_token_type_ids"],
            image_grid_thw=ref.get("image_grid_thw"),
            video_grid_thw=ref["video_grid_thw"],
            **kw,
        )
        assert torch.equal(got["positions"][1:], rope)
        trained = tok.decode(got["input_ids"][got["labels"] != -100])
        assert trained.endswith(rec["turns"][1][1] + "<|im_end|>") or trained == rec["turns"][1][1]
    if cls_name == "Qwen2_5_VLProcessor":  # the time per pair of frames moved the positions
        assert "second_per_grid_ts" in refs[0]


POLICY = {"qwen2vl": "qwen2vl:min_pixels=3136,max_pixels=50176",
          "qwen3vl": "qwen3vl:min_pixels=4096,max_pixels=65536",
          "glm4v": "glm4v:min_pixels=3136,max_pixels=50176"}  # fmt: skip
RULE = {"qwen2vl": f"{QWEN2},source=transformers", "qwen3vl": f"{QWEN3},max_pixels=262144",
        "glm4v": CASES["glm4v"][2],
        "llava_onevision": "llava-onevision:num_frames=2,image_size=112"}  # fmt: skip
# LLaVA-OneVision at a 112-px tile (8 x 8 patches), up to 2 x 2 tiles: rows short enough for
# the tiny model's attention in double precision (the released 384-px tile is tested above)
POLICY["llava_onevision"] = "llava-onevision:tile_size=112,max_grid=2,max_tiles=4"
# InternVL (-hf) at a 56-px tile (4 tokens a tile), up to 4 tiles an image, 2 frames a video
RULE["internvl"] = "internvl:source=transformers,num_frames=2,tile_size=56"
POLICY["internvl"] = "internvl:tile_size=56,max_tiles=4"
# LLaVA-NeXT-Video likewise at a 112-px tile, two grids
RULE["llava_next"] = "llava-next-video:num_frames=2,image_size=112"
POLICY["llava_next"] = "llava-next:tile_size=112,grids=1x2.2x1"
PROCESSOR = {"qwen2vl": "Qwen2VLProcessor", "qwen3vl": "Qwen3VLProcessor",
             "glm4v": "Glm4vProcessor"}  # fmt: skip


def _dataset(root: Path) -> Path:
    """Twelve samples: a video, two videos, an image and a video, an image, text only; the
    demo's images and real clips."""
    from dataprep import make_demo
    from dataprep.demo_media import write_videos

    demo = root / "demo"
    make_demo(demo, samples=4, seed=3, images=3)
    clips = write_videos(demo, np.random.default_rng(4), 4)
    images = sorted(str(p.relative_to(demo)) for p in (demo / "images").iterdir())
    kinds = [(["<video>"], [], clips[:1]), (["<video>", "<video>"], [], clips[1:3]),
             (["<image>", "<video>"], images[:1], clips[3:]), (["<image>"], images[1:2], []),
             ([], [], [])]  # fmt: skip
    rng = np.random.default_rng(0)
    words = "the a car bird rain falls runs over road sky".split()
    records = []
    for i in range(12):
        marks, imgs, vids = kinds[i % len(kinds)]
        say = lambda n: " ".join(rng.choice(words, n))  # noqa: E731
        rec = {"id": f"s{i}", "conversations": [
            {"from": "human", "value": "".join(m + "\n" for m in marks) + say(4) + "?"},
            {"from": "gpt", "value": say(int(rng.integers(3, 40))) + "."},
        ]}  # fmt: skip
        if imgs:
            rec["image"] = imgs[0]
        if vids:
            rec["video"] = vids if len(vids) > 1 else vids[0]
        records.append(rec)
    (demo / "videos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return demo


def _generation(root: Path, family: str, tokenizer_path: str) -> tuple[str, Path]:
    from equishard.cli import main

    demo = _dataset(root)
    own = family in ("glm4v", "llava_onevision", "internvl")  # its own template, else Qwen's
    mdir = make_model_dir(root, family if own else "qwen2vl", tokenizer_path)
    if family == "llava_next":
        mdir = _next_video_dir(root, tokenizer_path)
    cost, plan, gen = root / "cost.parquet", root / "plan", root / "shards"
    args = ["prep", str(demo / "videos.jsonl"), "--image-root", str(demo), "--no-progress"]
    args += ["--tokenizer", str(mdir / "tokenizer.json"), "--template", str(mdir)]
    args += ["--vision-policy", POLICY[family], "--video-rule", RULE[family], "-o", str(cost)]
    assert main(args) == 0
    assert main(["balance", str(cost), "--dp", "2", "--target-batch", "3", "-o", str(plan)]) == 0
    assert main(["write", str(plan), "--cost-table", str(cost), "--out", str(gen)]) == 0
    return str(gen), mdir


def _shares(gen: str) -> list[list]:
    """Every sample of the generation, rank 0 holding every one with a video."""
    from shards import GroupDataset, RankInfo

    every = [s for rank in range(2)
             for group in GroupDataset(gen, RankInfo(rank=rank, world_size=2))
             for s in group["samples"]]  # fmt: skip
    return [[s for s in every if s.videos], [s for s in every if not s.videos]]


@pytest.mark.parametrize("family", list(RULE))
def test_generation_rows_are_what_prep_counted(family, tmp_path, tokenizer_path):
    """From a generation: the packer takes the recorded video rule, and every row (images,
    videos, Qwen3-VL's timestamps) is as long as prep counted (the packer checks each)."""
    from dataprep.media_rules import parse_video_rule
    from trainer_adapter.hf.inputs import HFPacker

    gen, mdir = _generation(tmp_path, family, tokenizer_path)
    rule = parse_video_rule(RULE[family])
    proc = _family_processor(family, mdir)
    rope = _rope_index(PROCESSOR[family], proc.tokenizer) if family in PROCESSOR else None
    packer = HFPacker.from_generation(gen, proc, family=family, rope_index=rope)
    assert parse_video_rule(packer.video_rule) == rule
    shares = _shares(gen)
    assert len(shares[0]) == 8 and len(shares[1]) == 4
    row = packer(shares[0] + shares[1])  # raises on a row not as long as prep counted
    if family == "glm4v":  # the 11 videos' pairs among the 4 images, each its own grid
        grids = row["image_grid_thw"]
        assert "pixel_values_videos" not in row and (grids[:, 0] == 1).all()
        assert len(grids) == 4 + sum(len(v) // 2 for s in shares[0] for v in _frames(s, rule))
        patches = int(grids.prod(1).sum())
        assert row["pixel_values"].shape == (patches, 3 * 2 * rule.patch_size**2)
        assert int((row["input_ids"] == proc.image_token_id).sum()) == patches // 4
        return
    if family == "internvl":  # each frame a tile among the images' tiles
        frames = sum(len(v) for s in shares[0] for v in _frames(s, rule))
        tiles = row["pixel_values"]
        assert "pixel_values_videos" not in row and tiles.shape[1:] == (3, 56, 56)
        assert int((row["input_ids"] == proc.image_token_id).sum()) == 4 * len(tiles)
        assert len(tiles) > frames
        return
    if family in ("llava_onevision", "llava_next"):  # [videos, frames, C, H, W]: frame tiles
        side = rule.image_size
        assert row["pixel_values_videos"].shape == (11, rule.num_frames, 3, side, side)
        return
    assert len(row["video_grid_thw"]) == 11  # 3 samples of one, 3 of two, 2 after an image
    per_token = row["pixel_values_videos"].shape[1]
    assert per_token == 3 * 2 * rule.patch_size**2


def _family_processor(family: str, mdir: Path):
    """The family's processor as a CPU user loads it, with the generation's vision policy."""
    if family == "internvl":  # GOT-OCR2's tiler at the 56-px tile (POLICY)
        from transformers import InternVLProcessor
        from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

        tok = tf.AutoTokenizer.from_pretrained(str(mdir))
        ip = GotOcr2ImageProcessorPil(crop_to_patches=True, min_patches=1, max_patches=4,
                                      size={"height": 56, "width": 56})  # fmt: skip
        cls = type("InternVLProcessor", (InternVLProcessor,),
                   {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])})  # fmt: skip
        return cls(image_processor=ip, tokenizer=tok, image_seq_length=4,
                   chat_template=tok.chat_template)  # fmt: skip
    if family == "llava_next":  # LLaVA-NeXT's image processor at the 112-px tile (POLICY)
        from transformers import LlavaNextProcessor
        from transformers.models.llava_next import LlavaNextImageProcessorPil

        tok = tf.AutoTokenizer.from_pretrained(str(mdir))
        ip = LlavaNextImageProcessorPil(size={"shortest_edge": 112},
                                        crop_size={"height": 112, "width": 112},
                                        image_grid_pinpoints=[[112, 224], [224, 112]])  # fmt: skip
        return LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=14,
                                  vision_feature_select_strategy="default",
                                  num_additional_image_tokens=1,
                                  chat_template=tok.chat_template)  # fmt: skip
    if family == "llava_onevision":  # its 112-px tile (POLICY), as its processor takes it
        from transformers import LlavaOnevisionProcessor
        from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

        from dataprep.policies.anyres import square_grids

        tok = tf.AutoTokenizer.from_pretrained(str(mdir))
        pins = [list(g) for g in square_grids(112, 2)]
        ip = LlavaOnevisionImageProcessorPil(size={"height": 112, "width": 112},
                                             image_grid_pinpoints=pins)  # fmt: skip
        cls = type("LlavaOnevisionProcessor", (LlavaOnevisionProcessor,),
                   {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])})  # fmt: skip
        return cls(image_processor=ip, tokenizer=tok, num_image_tokens=64,
                   vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_4",
                   chat_template=tok.chat_template)  # fmt: skip
    from dataprep.media_rules import parse_video_rule

    return _processor(PROCESSOR[family], Path(mdir), parse_video_rule(RULE[family]),
                      POLICY[family])  # fmt: skip


def _tower(model):
    """The model's vision tower, which ``balance_model`` balances."""
    inner = model.model
    return getattr(inner, "visual", None) or inner.vision_tower


def _frames(sample, rule) -> list[list[int]]:
    """The frames ``rule`` samples of each of the sample's videos."""
    from dataprep.video_header import probe_video_bytes

    heads = [probe_video_bytes(v, "v") for v in sample.videos]
    pick = getattr(rule, "frame_indices", None) or rule.indices
    return [pick(h.frames, h.fps) for h in heads]


def _model(tok, family: str):
    """A tiny double-precision Qwen2-VL / Qwen3-VL with the tokenizer's vision token ids."""
    from tests.trainer_adapter.test_hf_inputs import _vision_token_ids

    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)  # fmt: skip
    torch.manual_seed(0)
    if family == "qwen3vl":
        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1],
                "mrope_interleaved": True}  # fmt: skip
        cfg = tf.Qwen3VLConfig(
            text_config={**text, "head_dim": 8, "rope_parameters": rope},
            vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2,
                               patch_size=16, out_hidden_size=32, num_position_embeddings=64,
                               deepstack_visual_indexes=[0]),
            **_vision_token_ids(tok),
        )  # fmt: skip
        return tf.Qwen3VLForConditionalGeneration(cfg).double()
    if family == "internvl":  # a tiny InternViT at the 56-px tile, 4 tokens a tile
        cfg = tf.InternVLConfig(
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=2, image_size=[56, 56], patch_size=[14, 14]),
            text_config={**text, "model_type": "qwen2"},
            image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), downsample_ratio=0.5,
            vision_feature_layer=-1, vision_feature_select_strategy="default",
        )  # fmt: skip
        return tf.InternVLForConditionalGeneration(cfg).double()
    if family == "llava_next":  # LLaVA-NeXT-Video: a tiny CLIP at the 112-px tile
        ids = tok.convert_tokens_to_ids
        vision = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, image_size=112, patch_size=14,
                      projection_dim=16)  # fmt: skip
        cfg = tf.LlavaNextVideoConfig(
            vision_config=vision, text_config={**text, "model_type": "llama"},
            image_grid_pinpoints=[[112, 224], [224, 112]],
            image_token_index=ids("<image>"), video_token_index=ids("<video>"),
            vision_feature_layer=-2, vision_feature_select_strategy="default",
        )  # fmt: skip
        return tf.LlavaNextVideoForConditionalGeneration(cfg).double()
    if family == "llava_onevision":  # a tiny SigLIP at the processor's 112-px tile
        from dataprep.policies.anyres import square_grids

        ids = tok.convert_tokens_to_ids
        vision = dict(
            model_type="siglip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=112,
            patch_size=14,
        )
        cfg = tf.LlavaOnevisionConfig(
            vision_config=vision, text_config={**text, "model_type": "qwen2"},
            image_grid_pinpoints=[list(g) for g in square_grids(112, 2)],
            image_token_index=ids("<image>"), video_token_index=ids("<video>"),
            vision_feature_layer=-1, vision_feature_select_strategy="full",
        )  # fmt: skip
        return tf.LlavaOnevisionForConditionalGeneration(cfg).double()
    if family == "glm4v":
        ids = tok.convert_tokens_to_ids
        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1],
                "partial_rotary_factor": 1.0}  # fmt: skip
        cfg = tf.Glm4vConfig(
            text_config={**text, "rope_parameters": rope},
            vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2,
                               image_size=28, patch_size=14, out_hidden_size=32),
            image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
            image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"),
        )  # fmt: skip
        return tf.Glm4vForConditionalGeneration(cfg).double()
    cfg = tf.Qwen2VLConfig(
        text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
        vision_config=dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        **_vision_token_ids(tok),
    )  # fmt: skip
    return tf.Qwen2VLForConditionalGeneration(cfg).double()


def _setup(gen: str, mdir: str, family: str):
    from trainer_adapter.hf.inputs import HFPacker

    proc = _family_processor(family, Path(mdir))
    model = _model(proc.tokenizer, family)
    packer = HFPacker.from_generation(
        gen, proc, family=family, rope_index=getattr(model.model, "get_rope_index", None)
    )
    return model, packer


def _loss(model, packer, samples, n_targets=None):
    row = packer(samples)
    for k in ("pixel_values", "pixel_values_videos"):
        if row.get(k) is not None:
            row[k] = row[k].double()
    labels = row.pop("labels")
    logits = model(**row, use_cache=False).logits
    n = n_targets if n_targets is not None else int((labels[..., 1:] != -100).sum())
    loss = torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), labels[0, 1:], ignore_index=-100, reduction="sum"
    )
    return loss / n, row


def _flat_grads(model) -> np.ndarray:
    params = dict(model.named_parameters())
    return torch.cat([(params[n].grad if params[n].grad is not None
                       else torch.zeros_like(params[n])).reshape(-1)
                      for n in sorted(params)]).numpy()  # fmt: skip


def rank_rows(rank, world, gen, mdir, family):
    """This rank's share (rank 0: every sample with a video) packed from the generation, one
    step with the tower and the LLM balanced, and one without (a fresh model each, in one
    process): each one's loss and gradient summed over the ranks."""
    import torch.distributed as dist

    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    out = {}
    for mode in ("balanced", "plain"):
        model, packer = _setup(gen, mdir, family)
        samples = _shares(gen)[rank]
        n = global_targets(packer(samples)["labels"])
        balance_model(model, policy=RedistributePolicy(enabled=mode == "balanced"))
        loss, _ = _loss(model, packer, samples, n)
        loss.backward()
        dist.all_reduce(loss := loss.detach())
        flat = torch.from_numpy(_flat_grads(model))
        dist.all_reduce(flat)
        moved = _tower(model).last_route.moved if mode == "balanced" else 0
        out[mode] = {"loss": float(loss), "grads": flat.numpy(), "moved": moved,
                     "videos": sum(len(s.videos) for s in samples)}  # fmt: skip
    return out


@pytest.mark.parametrize(
    "family",  # make test: Qwen's patch rows and frames as tiles; the rest in make test-slow
    sweep("balanced videos equal one process", RULE, fast=("qwen2vl", "internvl")),
)
def test_balanced_videos_equal_one_process(family, tmp_path, tokenizer_path):
    """On 2 gloo ranks, one holding every video: the loss and every gradient with the vision
    tower (images and videos) and the LLM balanced equal those without balancing and those of
    one process over all the rows; the balanced tower moved videos' frames to rank 1."""
    from tests.dist_helper import run_ranks

    gen, mdir = _generation(tmp_path, family, tokenizer_path)
    ranks = run_ranks(rank_rows, 2, gen, str(mdir), family, timeout=300)
    runs = {m: [r[m] for r in ranks] for m in ("balanced", "plain")}
    model, packer = _setup(gen, str(mdir), family)
    shares = _shares(gen)
    loss, _ = _loss(model, packer, shares[0] + shares[1])
    loss.backward()
    ref = _flat_grads(model)
    assert [r["videos"] for r in runs["plain"]] == [11, 0]
    for mode, ranks in runs.items():
        for r in ranks:
            assert r["loss"] == pytest.approx(loss.item(), rel=1e-6), mode
            # (float32 cross-entropy: 1e-8 over gradients of ~1e-4)
            np.testing.assert_allclose(r["grads"], ref, rtol=1e-5, atol=1e-8)
    assert runs["balanced"][0]["moved"] > 0
    tower = _tower(model)
    patch = dict(tower.named_parameters())[
        "embeddings.patch_embedding.weight"
        if family in ("llava_onevision", "llava_next")
        else "embeddings.patch_embeddings.projection.weight"
        if family == "internvl"
        else "patch_embed.proj.weight"
    ].grad
    assert patch is not None and patch.abs().sum() > 0
    if family == "glm4v":  # the pairs among the images: the model's own video path's loss
        from trainer_adapter.hf.video_inputs import pack_videos

        only = [s for s in shares[0] if not s.images]
        merged, row = _loss(model, packer, only)
        parts = [packer.sample(s.meta["turns"], [], video_bytes=list(s.videos)) for s in only]
        row.pop("pixel_values"), row.pop("image_grid_thw")
        row |= {k: v.double() if v.is_floating_point() else v
                for k, v in pack_videos(parts).items()}  # fmt: skip
        labels = torch.cat([p["labels"] for p in parts])[None]
        logits = model(**row, use_cache=False).logits
        own = torch.nn.functional.cross_entropy(logits[0, :-1].float(), labels[0, 1:],
                                                ignore_index=-100, reduction="mean")  # fmt: skip
        assert own.item() == pytest.approx(merged.item(), rel=1e-9)


def _qwen2(tmp_path, tokenizer_path, **kw):
    from dataprep.media_rules import parse_video_rule

    mdir = make_model_dir(tmp_path, "qwen2vl", tokenizer_path)
    return mdir, _processor("Qwen2VLProcessor", mdir, parse_video_rule(RULE["qwen2vl"]), **kw)


@pytest.mark.parametrize(
    "family, rule, message",
    [
        ("ernie45vl", "ernie45vl", r"builds the ernie45vl family's videos with ernie45vl \(none"),
        ("glm4v", "qwen2vl", r"builds the glm4v family's videos with glm4v;"),
        ("qwen2vl", "qwen3vl", r"builds the qwen2vl family's videos with qwen2vl;"),
        ("qwen3vl", "qwen2vl", r"builds the qwen3vl family's videos with qwen3vl;"),
        ("qwen2vl", "qwen2vl:fps=2,source=none", r"qwen video source must be one of"),
    ],
)
def test_a_rule_the_packer_cannot_build_is_refused(family, rule, message, tmp_path,
                                                    tokenizer_path):  # fmt: skip
    from trainer_adapter.hf.inputs import HFPacker

    mdir, proc = _qwen2(tmp_path, tokenizer_path)
    with pytest.raises(ValueError, match=message):
        HFPacker(family=family, processor=proc, template=str(mdir), rope_index=print,
                 video_rule=rule)  # fmt: skip


@pytest.mark.parametrize(
    "owner, setting, value, named",
    [
        ("image", "patch_size", 16, r"Qwen2VLImageProcessorPil.patch_size is 16.*has 14"),
        ("image", "temporal_patch_size", 1, r"temporal_patch_size is 1.*has 2"),
        ("image", "merge_size", 1, r"merge_size is 1.*has 2"),
        ("video", "min_frames", 1, r"min_frames is 1.*has 2"),
        ("video", "min_frames", 3, r"min_frames is 3.*has 2"),
        ("video", "max_frames", 767, r"max_frames is 767.*has 768"),
        ("video", "max_frames", 769, r"max_frames is 769.*has 768"),
        ("video", "shortest_edge", 3135, r"size\['shortest_edge'\] is 3135.*has 3136"),
        ("video", "shortest_edge", 3137, r"size\['shortest_edge'\] is 3137.*has 3136"),
        ("video", "longest_edge", 50175, r"size\['longest_edge'\] is 50175.*has 50176"),
        ("video", "longest_edge", 50177, r"size\['longest_edge'\] is 50177.*has 50176"),
        ("video", "min_frames", 2, None),  # the rule's own values: accepted
    ],
)
def test_the_processor_is_checked_against_the_video_rule(owner, setting, value, named,
                                                          tmp_path, tokenizer_path):  # fmt: skip
    """Each setting that changes a video's patches, at, below and above the rule's value, on
    the image processor (one tower) and on a video processor (a user's with torchvision)."""
    from types import SimpleNamespace

    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    mdir, proc = _qwen2(tmp_path, tokenizer_path)
    if owner == "image":
        setattr(proc.image_processor, setting, value)
    else:
        vp = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_frames": 2,
              "max_frames": 768, "size": {"shortest_edge": 3136, "longest_edge": 50176},
              "image_mean": proc.image_processor.image_mean, "image_std": [0.3] * 3,
              "rescale_factor": 1 / 255, "do_rescale": True, "do_normalize": True}  # fmt: skip
        if setting in vp["size"]:
            vp["size"] = {**vp["size"], setting: value}
        else:
            vp[setting] = value
        proc.video_processor = SimpleNamespace(**vp)
    make = lambda: HFPacker(family="qwen2vl", processor=proc, template=str(mdir),  # noqa: E731
                            rope_index=print, video_rule=RULE["qwen2vl"])  # fmt: skip
    if named is None:
        assert make()._video.std == (0.3, 0.3, 0.3)  # the video processor's scaling taken
        return
    with pytest.raises(SettingsMismatch, match=named):
        make()


@pytest.mark.parametrize(
    "setting, value, named",
    [
        ("fps", 1.5, r"Glm4vVideoProcessor.fps is 1.5.*has 2.0"),
        ("fps", 2.5, r"fps is 2.5.*has 2.0"),
        ("max_duration", 299, r"max_duration is 299.*has 300"),
        ("max_duration", 301, r"max_duration is 301.*has 300"),
        ("temporal_patch_size", 1, r"temporal_patch_size is 1.*has 2"),
        ("shortest_edge", 3135, r"size\['shortest_edge'\] is 3135.*has 3136"),
        ("shortest_edge", 3137, r"size\['shortest_edge'\] is 3137.*has 3136"),
        ("longest_edge", 401407, r"size\['longest_edge'\] is 401407.*has 401408"),
        ("longest_edge", 401409, r"size\['longest_edge'\] is 401409.*has 401408"),
        ("fps", 2.0, None),  # the rule's own values: accepted
    ],
)
def test_glm_video_processor_is_checked_against_its_rule(setting, value, named, tmp_path,
                                                          tokenizer_path):  # fmt: skip
    """GLM-4.1V: each video processor setting that changes a video's frames or sizes (its
    rate, longest duration, pixel bounds, pairs), at, below and above the rule's value."""
    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    spec = "glm4v:min_pixels=3136,max_pixels=401408"
    mdir = make_model_dir(tmp_path, "glm4v", tokenizer_path)
    proc = _processor("Glm4vProcessor", mdir, parse_rule(spec))
    vp = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "fps": 2.0,
          "max_duration": 300, "size": {"shortest_edge": 3136, "longest_edge": 401408},
          "image_mean": [0.4] * 3, "image_std": [0.3] * 3, "rescale_factor": 1 / 255,
          "do_rescale": True, "do_normalize": True}  # fmt: skip
    if setting in vp["size"]:
        vp["size"] = {**vp["size"], setting: value}
    else:
        vp[setting] = value
    proc.video_processor = type("Glm4vVideoProcessor", (SimpleNamespace,), {})(**vp)
    make = lambda: HFPacker(family="glm4v", processor=proc, template=str(mdir),  # noqa: E731
                            rope_index=print, video_rule=spec)  # fmt: skip
    if named is None:
        video = make()._video
        assert video.std == (0.3,) * 3 and video.token == "<|image|>"
        return
    with pytest.raises(SettingsMismatch, match=named):
        make()


def parse_rule(spec: str):
    from dataprep.media_rules import parse_video_rule

    return parse_video_rule(spec)


def test_pairs_stand_among_the_images_in_the_order_of_their_marks():
    """GLM-4.1V's row form: a video before an image, an image between two videos; a mark
    past its kind's items stays text (no block for it); each pair's grid ``(1, h, w)``."""
    from trainer_adapter.hf.video_inputs import pairs_among_images

    def block(tag, n):
        return torch.full((n, 2), float(tag))

    images = {"pixel_values": torch.cat([block(1, 4), block(2, 8)]),
              "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]])}  # fmt: skip
    videos = [{"patches": block(7, 12), "grid": (3, 2, 2)},
              {"patches": block(8, 4), "grid": (1, 2, 2)}]  # fmt: skip
    out = pairs_among_images(images, videos, [True, False, True, False, True, False])
    tags = out["pixel_values"][:, 0].tolist()
    assert tags == [7.0] * 12 + [1.0] * 4 + [8.0] * 4 + [2.0] * 8
    assert out["image_grid_thw"].tolist() == [[1, 2, 2]] * 3 + [[1, 2, 2], [1, 2, 2], [1, 2, 4]]
    only = pairs_among_images({}, videos[:1], [True])  # a sample without images
    assert only["image_grid_thw"].tolist() == [[1, 2, 2]] * 3 and len(only["pixel_values"]) == 12


def test_videos_the_packer_cannot_build_are_refused(tmp_path, tokenizer_path):
    """A sample's videos without a video rule, a template that writes other marks than the
    sample has videos, another rule than the generation's, an undecodable video: each
    refused naming the sample and the fix, never packed as text."""
    from types import SimpleNamespace

    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    mdir, proc = _qwen2(tmp_path, tokenizer_path)
    clip = (tmp_path / _videos(tmp_path)[0]).read_bytes()
    turns = [("user", "<video>\nWhat?"), ("assistant", "Rain.")]
    sample = SimpleNamespace(meta={"turns": turns, "sample_id": "v1"}, images=[], videos=[clip])
    plain = HFPacker(family="qwen2vl", processor=proc, template=str(mdir), rope_index=print)
    with pytest.raises(ValueError, match=r"sample 'v1' has 1 video\(s\).*video rule.*qwen2vl"):
        plain([sample])
    rope = _rope_index("Qwen2VLProcessor", proc.tokenizer)
    packer = HFPacker(family="qwen2vl", processor=proc, template=str(mdir), rope_index=rope,
                      video_rule=RULE["qwen2vl"])  # fmt: skip
    assert len(packer([sample])["video_grid_thw"]) == 1
    two = SimpleNamespace(meta={"turns": turns, "sample_id": "v2"}, images=[], videos=[clip] * 2)
    with pytest.raises(ValueError, match=r"wrote 1 video mark\(s\) '<video>' for 2 video"):
        packer([two])
    cut = SimpleNamespace(meta={"turns": turns, "sample_id": "v3"}, images=[],
                          videos=[clip[: len(clip) // 3]])  # fmt: skip
    with pytest.raises(Exception, match=r"sample 'v3' video 0"):
        packer([cut])
    gen, _ = _generation(tmp_path / "gen", "qwen2vl", tokenizer_path)
    proc = _processor("Qwen2VLProcessor", mdir, packer._video.rule, POLICY["qwen2vl"])
    with pytest.raises(SettingsMismatch, match=r"video_rule 'qwen2vl' given.*leave video_rule"):
        HFPacker.from_generation(gen, proc, family="qwen2vl", rope_index=rope,
                                 video_rule="qwen2vl")  # fmt: skip
    same = HFPacker.from_generation(gen, proc, family="qwen2vl", rope_index=rope,
                                    video_rule=RULE["qwen2vl"])  # fmt: skip
    assert same.video_rule == packer._video.rule.spec()


def _tile_rows(processor_refs, case: str, family: str, specs: dict):
    """Each record as the ``family`` packer builds it with the case's rule, beside the
    processor's outputs for it: (record, reference, built, processor, packer)."""
    from trainer_adapter.hf.inputs import HFPacker

    root, records, made = processor_refs
    proc, mdir, refs = made[case]
    packer = HFPacker(family=family, processor=proc, template=str(mdir), video_rule=specs[case])
    for rec, ref in zip(records, refs, strict=True):
        got = packer.sample(
            rec["turns"],
            [(root / i).read_bytes() for i in rec.get("images", ())],
            video_bytes=[(root / v).read_bytes() for v in rec["videos"]],
        )
        yield rec, ref, got, proc, packer


@pytest.mark.parametrize("case", list(INTERNVL))
def test_internvl_videos_equal_the_processor(case, processor_refs):
    """InternVL (-hf): each video's frames (the sampler's, from the middle of each step or its
    start, or by the second; resized to one tile, normalized) and the images' tiles, in the
    order their marks stand, equal ``InternVLProcessor``'s merged ``pixel_values`` exactly;
    the ids (``Frame{i}: <img>...</img>`` a frame) the processor's."""
    for rec, ref, got, proc, _packer in _tile_rows(processor_refs, case, "internvl", INTERNVL):
        assert got["input_ids"].tolist() == ref["input_ids"][0].tolist(), case
        assert torch.equal(got["pixel_values"], ref["pixel_values"])
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained.strip().startswith(rec["turns"][1][1]), trained


@pytest.mark.parametrize("case", list(NEXT))
def test_next_videos_equal_the_processor(case, processor_refs):
    """LLaVA-NeXT-Video: each video's frames (the sampler's, the shortest side resized to the
    tile, centre-cropped, normalized) equal ``LlavaNextVideoVideoProcessor``'s
    ``pixel_values_videos`` exactly, the ids (``<video>`` once a pooled patch) the
    processor's; its images' tiles as its image processor makes them. The packer takes
    LLaVA-NeXT's image processor alone (a CPU user's: the video processor needs torchvision)."""
    for rec, ref, got, proc, _packer in _tile_rows(processor_refs, case, "llava_next", NEXT):
        assert got["input_ids"].tolist() == ref["input_ids"][0].tolist(), case
        frames = torch.stack([v["frames"] for v in got["videos"]])
        assert torch.equal(frames, ref["pixel_values_videos"])
        if rec.get("images"):
            pix = ref["pixel_values"]
            assert torch.equal(got["pixel_values"], pix.reshape(-1, *pix.shape[2:]))
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained.strip().startswith(rec["turns"][1][1]), trained


@pytest.mark.parametrize("case", list(ONEVISION))
def test_onevision_videos_equal_the_processor(case, processor_refs):
    """LLaVA-OneVision: each video's frames (the sampler's, resized to the tile, normalized)
    equal ``LlavaOnevisionVideoProcessor``'s ``pixel_values_videos`` exactly, the ids (its
    ``<video>`` once a pooled patch, one newline) the processor's; images beside them as its
    image processor makes them; labels the answer's tokens only."""
    for rec, ref, got, proc, packer in _tile_rows(
        processor_refs, case, "llava_onevision", ONEVISION
    ):
        assert got["input_ids"].tolist() == ref["input_ids"][0].tolist(), case
        frames = torch.stack([v["frames"] for v in got["videos"]])
        assert frames.shape[1] == packer._video.rule.num_frames
        assert torch.equal(frames, ref["pixel_values_videos"])
        if rec.get("images"):
            pix = ref["pixel_values"]
            assert torch.equal(got["pixel_values"], pix.reshape(-1, *pix.shape[2:]))
        trained = proc.tokenizer.decode(got["input_ids"][got["labels"] != -100])
        assert trained.lstrip("\n").startswith(rec["turns"][1][1]), trained  # its first token
        # may carry the template's newline before it


@pytest.mark.parametrize("fps", OMNI_FPS)
def test_omni_videos_equal_its_processor(fps, processor_refs):
    """Qwen2.5-Omni's thinker: a video's frames alone (its processor's default), the
    ``<|VIDEO|>`` tokens, patches and grids equal ``Qwen2_5OmniProcessor``'s; positions equal
    the thinker's ``get_rope_index`` with the processor's seconds per pair of frames (the fps
    its call asks, not the sampled rate: ``fps=1.5`` moves them)."""
    from shards.read.prep_settings import SettingsMismatch
    from tests.trainer_adapter.test_hf_omni_inputs import thinker
    from trainer_adapter.hf.inputs import HFPacker

    root, records, made = processor_refs
    proc, mdir, refs = made[f"omni-{fps:g}"]
    model = thinker(proc.tokenizer)
    packer = HFPacker(
        family="qwen2_5_omni",
        processor=proc,
        template=str(mdir),
        rope_index=model.model.get_rope_index,
        video_rule=_omni_spec(fps),
    )
    for rec, ref in zip(records, refs, strict=True):
        got = packer.sample(
            rec["turns"],
            [(root / i).read_bytes() for i in rec.get("images", ())],
            video_bytes=[(root / v).read_bytes() for v in rec["videos"]],
        )
        ids = ref["input_ids"][0]
        assert got["input_ids"].tolist() == ids.tolist()
        assert torch.equal(
            torch.cat([v["patches"] for v in got["videos"]]), ref["pixel_values_videos"]
        )
        seconds = ref["video_second_per_grid"].reshape(-1)
        assert seconds.tolist() == pytest.approx([2 / fps] * len(rec["videos"]))
        rope, _ = model.model.get_rope_index(
            ids[None],
            image_grid_thw=ref.get("image_grid_thw"),
            video_grid_thw=ref["video_grid_thw"],
            attention_mask=torch.ones_like(ids)[None],
            second_per_grids=seconds,
        )
        assert torch.equal(got["positions"][1:], rope)
    with pytest.raises(
        SettingsMismatch, match=r"video size\['shortest_edge'\] is 100352.*has 3136"
    ):
        HFPacker(
            family="qwen2_5_omni",
            processor=proc,
            template=str(mdir),
            rope_index=model.model.get_rope_index,
            video_rule=f"{QWEN2},source=transformers",
        )
    with pytest.raises(ValueError, match="measure its videos with source=transformers"):
        HFPacker(
            family="qwen2_5_omni",
            processor=proc,
            template=str(mdir),
            rope_index=model.model.get_rope_index,
            video_rule=f"{QWEN2},source=qwen-vl-utils",
        )


@pytest.mark.parametrize(
    "source, size, min_frames, ok",
    [
        # the transformers source: the video processor's own bounds when the rule gives none
        ("transformers", 768 * 28 * 28, 2, True),
        ("transformers", 768 * 28 * 28 + 1, 2, False),
        ("transformers", 768 * 28 * 28 - 1, 2, False),
        ("transformers", 768 * 28 * 28, 3, False),
        # qwen-vl-utils samples and sizes the frames itself: the video processor's frame
        # bounds and size do not apply (it runs with do_resize=False, do_sample_frames=False)
        ("qwen-vl-utils", 768 * 28 * 28 + 1, 3, True),
    ],
)
def test_the_video_processor_bounds_that_apply_to_the_source(
    source, size, min_frames, ok, tmp_path, tokenizer_path
):
    from types import SimpleNamespace

    from shards.read.prep_settings import SettingsMismatch
    from trainer_adapter.hf.inputs import HFPacker

    mdir, proc = _qwen2(tmp_path, tokenizer_path)
    proc.video_processor = SimpleNamespace(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_frames=min_frames,
        max_frames=768,
        size={"shortest_edge": 3136, "longest_edge": size},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        rescale_factor=1 / 255,
        do_rescale=True,
        do_normalize=True,
    )
    spec = f"qwen2vl:min_pixels=3136,min_frames=2,source={source}"  # max_pixels 0: the source's

    def make():
        return HFPacker(family="qwen2vl", processor=proc, template=str(mdir),
                        rope_index=print, video_rule=spec)  # fmt: skip

    if ok:
        assert make()._video.rule.source == source
        return
    with pytest.raises(SettingsMismatch):
        make()


def test_scaling_without_normalization_and_an_undecodable_video(
    tmp_path, tokenizer_path, monkeypatch
):
    """A processor that rescales without normalizing (``rescale``: the frames times the
    factor) or neither; a video whose header promises frames its stream does not decode is
    refused naming the sample."""
    from dataprep.media_rules import parse_video_rule
    from trainer_adapter.hf.video_inputs import QwenVideo

    rule = parse_video_rule(RULE["qwen2vl"])
    frames = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    kw = dict(
        rule=rule, token="<|video_pad|>", mean=(0.5,) * 3, std=(0.5,) * 3, rescale_factor=1 / 255
    )
    only = QwenVideo(**kw, do_rescale=True, do_normalize=False).scaled(frames)
    assert torch.equal(only, frames.float() * (1 / 255))
    none = QwenVideo(**kw, do_rescale=False, do_normalize=False).scaled(frames)
    assert torch.equal(none, frames.float())
    both = QwenVideo(**kw, do_rescale=True, do_normalize=True).scaled(frames)
    assert torch.allclose(both, (frames.float() / 255 - 0.5) / 0.5, atol=1e-6)
    # another factor: the mean and std over it, not over its floor (1 / 0.003 is 333.3)
    odd = QwenVideo(**{**kw, "rescale_factor": 0.003}, do_rescale=True, do_normalize=True)
    assert torch.allclose(odd.scaled(frames), (frames.float() * 0.003 - 0.5) / 0.5, atol=1e-5)
    import shards.read.media as media

    def short(data, indices):
        raise IndexError(f"the video has 3 frames, no {list(indices)[-1:]}")

    monkeypatch.setattr(media, "decode_video", short)
    clip = (tmp_path / _videos(tmp_path)[0]).read_bytes()
    video = QwenVideo(**kw, do_rescale=True, do_normalize=True)
    with pytest.raises(ValueError, match=r"sample 'v9' video 0: the video has 3 frames.*header"):
        video(clip, "sample 'v9' video 0")


@pytest.mark.parametrize("tps", [1, 2, 3])
def test_patches_fill_the_last_temporal_patch_as_prep_counts(tps):
    """Every frame count, with temporal patches of 1, 2 and 3 frames: as many temporal patches
    as prep's rule counts (``ceil(n / tps)``), the last filled with copies of the last frame;
    the inputs are keyword-only."""
    import dataclasses

    from dataprep.media_rules import QwenVideoRule
    from trainer_adapter.hf.video_inputs import QwenVideo

    rule = QwenVideoRule(temporal_patch_size=tps, patch_size=2, merge_size=1)
    video = QwenVideo(rule=rule, token="X", mean=(0.0,) * 3, std=(1.0,) * 3, rescale_factor=1.0,
                      do_rescale=False, do_normalize=False)  # fmt: skip
    for n in range(1, 8):
        frames = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 2, 2)
        patches, (t, gh, gw) = video.patches(frames)
        assert t == -(-n // tps) and (gh, gw) == (1, 1)
        # a patch's values are [C, tps, p, p]: its frames' indices, the last repeated
        last = patches[-1].view(3, tps, 2, 2)[0, :, 0, 0].tolist()
        assert last == [min(k, n - 1) for k in range((t - 1) * tps, t * tps)]
    with pytest.raises(TypeError):
        QwenVideo(rule, "X", (0.0,) * 3, (1.0,) * 3, 1.0, False, False)
    assert all(f.kw_only for f in dataclasses.fields(QwenVideo))
    with pytest.raises(dataclasses.FrozenInstanceError):
        video.rule = None


@pytest.mark.parametrize("merge", [1, 2, 3])
def test_a_videos_tokens_are_the_ones_prep_counts(merge):
    """The tokens the packer writes for a video equal prep's ``llm_tokens`` of its rule, for
    merge sizes 1, 2 and 3 (every pair of frames' patches over ``merge^2``)."""
    from dataprep.media_rules import QwenVideoRule
    from dataprep.video_header import VideoHeader
    from trainer_adapter.hf.video_inputs import QwenVideo

    rule = QwenVideoRule(source="transformers", merge_size=merge, min_pixels=3136, min_frames=2,
                         max_pixels=50176)  # fmt: skip
    video = QwenVideo(rule=rule, token="X", mean=(0.0,) * 3, std=(1.0,) * 3, rescale_factor=1.0,
                      do_rescale=False, do_normalize=False)  # fmt: skip
    for frames, width, height in ((12, 160, 96), (31, 320, 240), (5, 128, 224)):
        header = VideoHeader(nbytes=1, width=width, height=height, frames=frames, fps=8.0,
                             duration=frames / 8.0, codec="h264", container="mp4")  # fmt: skip
        n = rule.frames(frames, 8.0)
        h, w = rule.frame_size(width, height, n)
        grid = (-(-n // 2), h // 14, w // 14)
        written = video.text({"grid": grid, "stamps": []}).count("X")
        assert written == rule.cost(header).llm_tokens
