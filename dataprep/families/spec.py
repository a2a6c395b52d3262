"""What a model family is, as one object: :class:`FamilySpec`.

A family is a published model family as its Hugging Face processor makes its inputs (Qwen2-VL,
LLaVA-NeXT, Gemma 3, ...). Its spec holds everything equishard needs to know of it, at every
stage:

* prep: the vision policies that count its images (:class:`PolicySpec`: the spec name's class,
  options and defaults) and the image marker its chat template writes (:class:`ImageTokens`,
  under its template family's name);
* the settings check at training time: the processor's settings each policy field must equal
  (``processor_checks``);
* the Hugging Face packer: how its rows are built (:class:`PackerRules`).

Each family is one module of :mod:`dataprep.families` exporting ``SPEC``; the registry
(:mod:`dataprep.families.registry`) lists the modules and derives every table the stages read
from the specs. Nothing here imports a stage above prep: the packer rules are data, and a
processor check reads the packer it is given by duck typing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dataprep.policies.base import VisionPolicy

__all__ = ["FamilySpec", "ImageTokens", "PackerRules", "PolicySpec"]


@dataclass(frozen=True)
class ImageTokens:
    """How a family's processor expands the marker its template writes for one image."""

    marker: str
    prefix: str = ""
    suffix: str = ""
    also: str = ""  # what the template source holds besides the marker (a shared marker)


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """How a vision-policy spec name builds its policy: ``cls(**defaults, **options, **fixed)``.

    ``ints``: options given as non-negative integers; ``flags``: those of them that are 0/1
    switches; ``floats``: options given as numbers; ``strings``: string options and their allowed
    values (empty: any text, checked by the policy); ``fixed``: keyword arguments the spec cannot
    change (Pixtral's policy learns which name it was built under). ``help``: the lines ``equishard
    prep --help`` shows for it."""

    cls: type[VisionPolicy]
    ints: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    floats: frozenset[str] = frozenset()
    strings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    help: str = ""

    def __post_init__(self) -> None:
        # an option has one kind: the spec parser reads it as the first kind that names it
        kinds = (self.ints, self.floats, frozenset(self.strings))
        both = sorted(set().union(*(a & b for i, a in enumerate(kinds) for b in kinds[i + 1 :])))
        if both or not self.flags <= self.ints:
            raise ValueError(
                f"{self.cls.__name__}'s spec: options {both or sorted(self.flags - self.ints)} "
                "have more than one kind (or are switches that are not whole numbers)"
            )

    def build(self, options: dict) -> VisionPolicy:
        return self.cls(**{**self.defaults, **options, **self.fixed})


def policy(cls, ints, flags=(), floats=(), strings=None, defaults=None, fixed=None, help=""):
    """A :class:`PolicySpec` (``flags`` are integer options too)."""
    return PolicySpec(
        cls=cls,
        ints=frozenset(ints) | frozenset(flags),
        flags=frozenset(flags),
        floats=frozenset(floats),
        strings=strings or {},
        defaults=defaults or {},
        fixed=fixed or {},
        help=help,
    )


@dataclass(frozen=True, kw_only=True)
class PackerRules:
    """How :class:`~trainer_adapter.hf.inputs.HFPacker` builds the family's rows.

    ``rope_positions``: 3-D positions from the model's ``get_rope_index`` (patches +
    ``image_grid_thw``: each image's tokens are ``grid.prod() / merge^2``); ``fixed_tokens``: a
    fixed ``num_image_tokens`` an image; ``spelled``: the processor's ``replace_image_token``
    writes each image's text; ``nested``: a sample's images go to the image processor together
    (one multi-image sample); ``tiles``: ``[1, tiles, C, H, W]`` with a tile mask beside them;
    ``one_image_per_call``: each image processed alone, these keys joined (a call pads or counts
    its images together); ``beside``: what travels beside ``pixel_values``, joined along the
    first dimension; ``per_token``: a per-token input besides the ids (image masks, experts);
    ``audio``: how its recordings' features reach the model (``packed``: each recording's
    frames, ``[recordings, mel, longest]`` with ``feature_attention_mask``, the thinker packing
    the masked frames side by side; ``window``: every recording's whole window as the
    processor pads it, ``[recordings, mel, window]`` with its frame mask, for a padded encoder
    (Qwen2-Audio); ``windows``: every recording cut into whole windows, each padded as the
    processor pads it, ``[windows, mel, window]`` (Audio Flamingo 3); empty: it takes no
    recordings); ``audio_mask``: the name of the frame mask beside them; ``videos``: the
    packer builds its videos (Qwen's temporal patches: ``pixel_values_videos`` with
    ``video_grid_thw``, :mod:`~trainer_adapter.hf.video_inputs`); ``videos_with_images``: a
    video's pairs of frames travel among the images instead (``pixel_values`` and
    ``image_grid_thw``, one ``(1, h, w)`` a pair, in the order their tokens stand): GLM-4.1V's
    model scatters its image features and its video features each over every ``<|image|>``
    token, so a row with both would fail; its tower runs a pair as an image alike."""

    rope_positions: bool = False
    fixed_tokens: bool = False
    spelled: bool = False
    nested: bool = False
    tiles: bool = False
    one_image_per_call: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()
    per_token: str | None = None
    audio: str = ""
    audio_mask: str = "feature_attention_mask"
    videos: bool = False
    videos_with_images: bool = False

    def __post_init__(self) -> None:
        if self.videos_with_images and not self.videos:
            raise ValueError("PackerRules.videos_with_images needs videos=True")
        if self.audio not in ("", "packed", "window", "windows"):
            raise ValueError(
                f"PackerRules.audio must be '', 'packed', 'window' or 'windows', got {self.audio!r}"
            )


# (the policy field or a label, the processor's value read from the packer, [the policy's value])
ProcessorCheck = tuple[str, Callable] | tuple[str, Callable, Callable]


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """One model family. ``name``: as ``HFPacker(family=...)`` takes it; ``models``: what it
    covers, for the help texts; ``policies``: the vision-policy names that count its images (in
    order; ``fixed`` is ``fixed:S/P``), those it defines in ``policy_specs``; ``template``: the
    template image family whose marker its chat template writes (several families may share
    one, with equal ``image_tokens``; None and no policies for a family whose models take no
    images, whose template writes only its ``media_tokens``); ``processor_checks``: each
    setting the processor and the generation's policy must agree on; ``packer``: how its rows
    are built; ``media_tokens``: the markers its template writes for videos and recordings."""

    name: str
    models: str
    policies: tuple[str, ...]
    policy_specs: dict[str, PolicySpec] = field(default_factory=dict)
    template: str
    image_tokens: ImageTokens | None  # None: an audio-only family (no vision policy)
    processor_checks: tuple[ProcessorCheck, ...] = ()
    packer: PackerRules = PackerRules()
    # the marker its template writes for a video or a recording, as its processor expands it
    # (``{"video": ImageTokens("<|video_pad|>")}``); a modality left out has no rule here
    media_tokens: dict[str, ImageTokens] = field(default_factory=dict)
    # the video rules (:data:`dataprep.media_rules.VIDEO_RULES`) that are its processor's: a
    # prep with its vision policy may measure videos with them, and only with them
    video_rules: tuple[str, ...] = ()
    # the vision policies of its models that take videos, where not all do (Idefics3 beside
    # SmolVLM2): a prep with another of its policies refuses a video rule
    video_policies: tuple[str, ...] = ()
    # the audio rules (:data:`dataprep.media_rules.AUDIO_RULES`) that are its processor's: a
    # prep with one of them needs one of its vision policies
    audio_rules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"family name {self.name!r}: letters, digits and _ only")
        unknown = sorted(set(self.policy_specs) - set(self.policies))
        if unknown:
            raise ValueError(f"family {self.name}: policy_specs {unknown} not in its policies")
        if (not self.policies) != (self.image_tokens is None):
            raise ValueError(
                f"family {self.name}: a family with an image marker needs a vision policy that "
                "counts its images, and an audio-only one (image_tokens=None) has none"
            )
        if self.image_tokens is None and "audio" not in self.media_tokens:
            raise ValueError(f"family {self.name}: no image marker and no audio marker")
        stray = sorted(set(self.video_policies) - set(self.policies))
        if stray or (self.video_policies and not self.video_rules):
            raise ValueError(
                f"family {self.name}: video_policies {list(self.video_policies)} must be among "
                f"its policies {list(self.policies)}, beside video rules"
            )
        for what, rules in (("video", self.video_rules), ("audio", self.audio_rules)):
            if rules and what not in self.media_tokens:
                raise ValueError(
                    f"family {self.name}: {what} rules {list(rules)} but no {what} marker in "
                    f"media_tokens (how its template writes a {what})"
                )
