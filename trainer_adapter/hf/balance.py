"""Runtime balancing inside Hugging Face vision-language models, in the user's own loop.

Wrappers install a balanced ``forward`` on a module of the model (parameter names, state
dicts and checkpoints are unchanged); both are collectives over the DP group, so every rank
must run every step's forward and backward:

* around the vision tower, by what its forward takes: :func:`balance_vision` (Qwen-style
  patches + ``grid_thw``), :func:`balance_tiles` (InternVL, LLaVA, SigLIP, Idefics3 tiles),
  :func:`~trainer_adapter.hf.pixtral.balance_pixtral` (images of their own sizes),
  :func:`~trainer_adapter.hf.naflex.balance_naflex` (NaFlex patch rows),
  :func:`~trainer_adapter.hf.patch_positions.balance_patch_positions` (patch rows with their
  positions): :mod:`trainer_adapter.hf.towers` and those modules. Each spreads this rank's
  images over the group by modeled encoder cost, runs the tower on what this rank received
  and returns the outputs of this rank's own images in their original order; gradients take
  the reverse way.
* :func:`balance_decoder` around the language model (:mod:`trainer_adapter.hf.decoder`): whole
  samples of one packed row per rank are spread by LLM cost and their hidden states come home,
  where the LM head and loss run as without balancing.

For gradients identical to a single process over the global batch, normalize the loss by the
global number of target tokens: ``num_items_in_batch=global_targets(labels, group)``. Inside
``with paused(model):`` the wrapped modules run each rank's own inputs with no exchange
(``generate``, a rank that evaluates alone). One rank's error in a step is raised on every
rank (:mod:`trainer_adapter.group_errors`). :func:`balance_model` installs the right ones on a
``transformers`` VLM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings

import torch
import torch.distributed as dist

from balancing.first_call import prewarm
from equishard.common.values import check_flag
from trainer_adapter.exchange import collective_device
from trainer_adapter.hf.audio import balance_audio
from trainer_adapter.hf.decoder import balance_decoder
from trainer_adapter.hf.naflex import balance_naflex
from trainer_adapter.hf.patch_positions import balance_patch_positions
from trainer_adapter.hf.pixtral import balance_pixtral
from trainer_adapter.hf.rounds import settle_on_entry
from trainer_adapter.hf.towers import balance_tiles, balance_vision
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = [
    "balance_audio",
    "balance_decoder",
    "balance_model",
    "balance_tiles",
    "balance_vision",
    "global_targets",
    "paused",
]


def global_targets(labels: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Target tokens of all ranks (labels != -100 after the shift HF's causal-LM loss makes)."""
    n = (labels[..., 1:] != -100).sum().to(torch.int64).reshape(1)
    n = n.to(collective_device(group))
    dist.all_reduce(n, group=group)
    return n[0]


@contextlib.contextmanager
def paused(model: torch.nn.Module):
    """Inside the block the model's balanced modules run as without equishard: each rank its
    own inputs, no exchange, no collective, so ranks may call the model differently (``generate``
    with a KV cache, evaluation on one rank only). On exit balancing is back as before."""
    mods = [m for m in model.modules() if hasattr(m, "equishard_paused")]
    if not mods:
        raise ValueError(
            f"{type(model).__name__} has no balanced modules: call balance_model(model) first"
        )
    before = [m.equishard_paused for m in mods]
    for m in mods:
        m.equishard_paused = True
    try:
        yield model
    finally:
        for m, was in zip(mods, before, strict=True):
            m.equishard_paused = was


def balance_model(
    model: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    encoder: bool = True,
    llm: bool = True,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
    measure: bool = False,
    timer=None,
) -> torch.nn.Module:
    """Balance a ``transformers`` VLM in place: its vision tower (``encoder``) and/or its
    language model (``llm``). Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 / GLM-4.1V
    (``.visual``: patches + ``grid_thw``; Qwen3-VL's deepstack features go both ways),
    InternVL, LLaVA / LLaVA-NeXT / LLaVA-OneVision (``.vision_tower``: tiles), Idefics3 /
    SmolVLM (``.vision_model``: tiles with their patch masks; ``.text_model``), Gemma 3 (tiles;
    its decoder masks move with the samples), Mistral 3 / Pixtral (images of their own sizes:
    :func:`~trainer_adapter.hf.pixtral.balance_pixtral`), Idefics2, Aya Vision, Command A
    Vision, VipLLaVA (tiles), Llama 4 (``.vision_model``: tiles; its ``.language_model`` is a
    causal LM, whose inner decoder is balanced), ERNIE 4.5-VL (a Qwen-style ``.vision_tower``;
    the wrapper follows what the tower's forward takes: ``grid_thw``, ``image_sizes``,
    ``spatial_shapes`` (LFM2-VL: :func:`~trainer_adapter.hf.naflex.balance_naflex`),
    ``pixel_position_ids`` (Gemma 4: :func:`~trainer_adapter.hf.patch_positions.
    balance_patch_positions`) or tiles), DeepSeek-VL and its hybrid (both of its towers, the
    high-resolution SAM too). An ``.audio_tower`` is balanced beside them
    (:func:`~trainer_adapter.hf.audio.balance_audio`): Qwen2.5-Omni's thinker (audio and
    vision towers both), Qwen2-Audio, Voxtral and Audio Flamingo 3 (audio only). Feed each
    rank one packed row
    (:func:`balance_decoder`'s convention). An encoder-decoder language model (Florence-2's
    BART) is refused with ``llm=True``.

    ``measure``: a phase not balanced (``encoder=False`` or ``llm=False``) is still planned, as
    a dry run (``RedistributePolicy.dry_run``): none of its items moves, and its module's
    ``last_route`` holds the loads the ranks had and the loads balancing would have given. A
    run with balancing off then logs what it would have gained, at the price of one small
    gather of item lengths per call.

    ``timer``: a :class:`~trainer_adapter.phase_timer.PhaseTimer`; each balanced module's run
    on the items this rank received is timed in it (the towers as ``vision``, the decoder as
    ``llm``), with those items' lengths: the forward's own work, apart from the exchanges (the
    backward is taken as proportional to it). ``equishard calibrate`` fits costs to what it
    records (:mod:`trainer_adapter.phase_timer`). Returns the model."""
    for name, value in (("encoder", encoder), ("llm", llm), ("measure", measure)):
        check_flag(name, value)
    inner = getattr(model, "model", model)
    decoder = getattr(inner, "language_model", None) or getattr(inner, "text_model", None)
    if decoder is not None and hasattr(decoder, "lm_head"):  # Llama 4: a causal LM; its decoder
        decoder = decoder.model  # runs the samples, its head the rank's own tokens
    tower = next(
        (t for a in ("visual", "vision_tower", "vision_model") if (t := getattr(inner, a, None))),
        None,
    )
    audio = getattr(inner, "audio_tower", None)
    # the wrapper by what the tower's forward takes, whatever the model calls it
    takes = inspect.signature(tower.forward).parameters if tower is not None else {}
    wrap = balance_tiles
    if "grid_thw" in takes:  # Qwen-style: patches + grid_thw (ERNIE 4.5-VL's .vision_tower)
        wrap = balance_vision
    elif "image_sizes" in takes:
        wrap = balance_pixtral  # Mistral 3, Pixtral: images of their own sizes
    elif "spatial_shapes" in takes:
        wrap = balance_naflex  # LFM2-VL's SigLIP2: padded patch rows of each image's grid
    elif "pixel_position_ids" in takes:
        wrap = balance_patch_positions  # Gemma 4: padded patch rows with their positions
    # a second tower the model runs on the same images after the first (DeepSeek-VL's hybrid:
    # SAM on 1024-px copies beside SigLIP on 384-px ones): balanced too, settled together
    second = getattr(inner, "high_res_vision_model", None)
    if (tower is None and audio is None) or decoder is None:
        raise ValueError(
            f"{type(model).__name__}: no .visual/.vision_tower/.vision_model/.audio_tower and "
            ".language_model/.text_model; wrap the tower and the decoder with balance_vision / "
            "balance_tiles / balance_audio / balance_decoder"
        )
    two_stack = getattr(getattr(decoder, "config", None), "is_encoder_decoder", False)
    if llm and two_stack:
        raise ValueError(
            f"{type(model).__name__}: its language model {type(decoder).__name__} is an "
            "encoder-decoder (Florence-2's BART): balance_decoder moves the samples of one "
            "packed decoder row, not encoder and decoder sequences together; balance the "
            "vision tower only (balance_model(..., llm=False))"
        )
    prewarm()  # the runtime kernels load (or start compiling) while the job sets up
    policy = policy or RedistributePolicy()
    for module in (tower, second, audio, decoder):
        if module is not None:
            module.equishard_timer = timer
    # a phase not balanced: measured (a dry run of the plan) or left as it is
    off = RedistributePolicy(enabled=False)
    unbalanced = dataclasses.replace(policy, enabled=True, dry_run=True) if measure else off
    towers = [tower] if second is None else [tower, second]
    encoders = []  # in the order the model calls them
    if encoder or measure:
        phase = policy if encoder else unbalanced
        if tower is not None:
            wrap(tower, group=group, topology=topology, policy=phase)
            encoders.append(towers)
        if second is not None:  # its forward takes the images' high-resolution copies
            balance_tiles(second, group=group, topology=topology, policy=phase)
        if audio is not None and _audio_balanced(audio, group, topology, phase, tower):
            audio_first = tower is None or _calls_audio_first(inner)
            encoders.insert(0 if audio_first else len(encoders), [audio])
    if encoder or llm or measure:
        balance_decoder(
            decoder,
            group=group,
            topology=topology,
            # an encoder-decoder's (Florence-2's BART) samples are not planned: not measured
            policy=policy if llm else (off if two_stack else unbalanced),
            encoders=encoders,
        )
    for called in encoders[1:]:  # a later tower: the earlier ones settled before its gather
        getters = _AUDIO_GETTERS if called[0] is audio else _VISION_GETTERS
        for name in getters:
            if callable(getattr(inner, name, None)):
                settle_on_entry(inner, name, called[0])
    return model


# the model methods that call a tower (transformers' names)
_VISION_GETTERS = ("get_image_features", "get_video_features")
_AUDIO_GETTERS = ("get_audio_features",)


def _audio_balanced(audio, group, topology, policy, tower) -> bool:
    """Wrap the audio tower; one of a kind :func:`balance_audio` does not know runs on each
    rank's own recordings as without equishard (no collective, so nothing to agree on),
    said in a warning, while the vision tower and the LLM are balanced. A model with no
    vision tower has nothing else to balance there: refused."""
    try:
        balance_audio(audio, group=group, topology=topology, policy=policy)
    except ValueError as e:
        if tower is None:
            raise
        warnings.warn(
            f"{e} -- its audio tower runs unbalanced, on each rank's own recordings",
            stacklevel=3,
        )
        return False
    return True


def _calls_audio_first(inner: torch.nn.Module) -> bool:
    """Whether the model's forward runs its audio tower before its vision tower (Qwen2.5-Omni's
    thinker does), read from its own code: every rank settles the towers' rounds in that
    order (:mod:`trainer_adapter.hf.rounds`)."""
    try:
        code = inspect.getsource(type(inner).forward)
    except (OSError, TypeError) as e:
        raise ValueError(
            f"{type(inner).__name__}: cannot read its forward to find whether it runs its audio "
            "or its vision tower first; balance one of them only, or wrap them with "
            "balance_audio / balance_vision and give balance_decoder(encoders=[...]) in order"
        ) from e
    at = lambda *calls: min((i for c in calls if (i := code.find(c)) >= 0), default=-1)  # noqa: E731
    audio = at("get_audio_features(", "audio_tower(")
    vision = at("get_image_features(", "get_video_features(", "visual(", "vision_tower(")
    if audio < 0 or vision < 0:
        raise ValueError(
            f"{type(inner).__name__}: its forward calls no get_audio_features or no "
            "get_image_features that equishard can see, so the order of its towers is unknown; "
            "wrap them with balance_audio / balance_vision and give balance_decoder("
            "encoders=[...]) in the order the model calls them"
        )
    return audio < vision
