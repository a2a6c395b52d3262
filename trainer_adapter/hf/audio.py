"""Balanced forwards for the audio towers of Hugging Face models (see
:mod:`trainer_adapter.hf.balance`): each rank's recordings are spread over the group by the
audio encoder's own cost, the tower runs on what the rank received, and the outputs of the
rank's own recordings come home in their original order (gradients the reverse way). Each
call is one exchange round (:mod:`trainer_adapter.hf.rounds`), settled with the model's other
towers in the order the model calls them.

Two kinds of Whisper-style towers, told apart by what their forward takes:

* **packed, unpadded** (Qwen2.5-Omni's thinker: ``forward(input_features, feature_lens,
  aftercnn_lens)``, every recording's frames side by side in ``[mel, frames]``): a recording
  runs as chunks of ``2 * n_window`` frames, each its own attention sequence, so its cost is
  the chunks' (``alpha * positions + beta * sum(chunk**2)``, the rule prep measures with:
  :func:`dataprep.media_rules.whisper_audio.chunk_positions`); its output tokens are the
  tower's own ``_get_feat_extract_output_lengths`` of its frames, which is how its outputs
  are routed home.
* **padded windows** (Qwen2-Audio, Voxtral: ``forward(input_features, attention_mask)``, one
  ``[mel, frames]`` window per row, every window padded to the same length): every window
  costs the same (the padded encoder's count x longest), so the windows are spread evenly;
  each window's rows of the 4-D attention mask travel with it (Voxtral gives none).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.encoder_phases import audio_phase
from trainer_adapter.hf.packing import PACKING_KEYS, check_item_inputs
from trainer_adapter.hf.rounds import install, joined, plan_round, shape_columns
from trainer_adapter.item_outputs import param_zeros, route_home, run_received
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["audio_cost", "balance_audio"]

# per-layer outputs have the stem's rows, not the output tokens': not routed home by tokens
_PER_LAYER = ("output_hidden_states", "output_attentions")


def audio_cost(tower: torch.nn.Module, policy: RedistributePolicy):
    """The audio phase's coefficients: a calibrated policy's (measured beats modeled), else
    from the tower's own size (``d_model`` x ``encoder_layers``, bidirectional attention)."""
    from balancing import CostModel

    if policy.cost_model.calibrated:
        return policy.cost_model.audio
    cfg = tower.config
    return CostModel.from_dims(
        vit_hidden=1,
        vit_layers=1,
        llm_hidden=1,
        llm_layers=1,
        audio_hidden=int(cfg.d_model),
        audio_layers=int(cfg.encoder_layers),
    ).audio


def _refuse_per_layer(where: str, kwargs: dict) -> None:
    asked = [k for k in _PER_LAYER if kwargs.get(k)]
    if asked:
        raise ValueError(
            f"{where} was asked for {', '.join(asked)}: an audio tower's per-layer outputs "
            "have one row per position after its stem, not per output token, and balancing "
            "routes outputs home by output tokens; ask for the last hidden state only, or "
            "balance the decoder only (balance_model(..., encoder=False))"
        )


def _frames(feature_lens, input_features, where: str) -> np.ndarray:
    if feature_lens is None:
        raise ValueError(f"{where} was given input features but no feature_lens")
    lens = feature_lens.detach().to("cpu", torch.int64).reshape(-1).numpy()
    if (lens < 1).any():
        bad = int(np.flatnonzero(lens < 1)[0])
        raise ValueError(f"{where}: recording {bad} has {int(lens[bad])} frames; give >= 1")
    if input_features.ndim != 2 or input_features.shape[1] != lens.sum():
        raise ValueError(
            f"{where} was given input features of shape {tuple(input_features.shape)}, its "
            f"feature_lens make {int(lens.sum())} frames: give [mel bins, frames] with every "
            "recording's frames side by side (the processor's masked features)"
        )
    return lens


def _output_tokens(tower: torch.nn.Module, frames: np.ndarray) -> np.ndarray:
    """Output tokens per recording: the tower's own formula."""
    got = tower._get_feat_extract_output_lengths(torch.from_numpy(frames))
    out = got[-1] if isinstance(got, tuple) else got
    return out.to(torch.int64).numpy().reshape(-1)


def _balance_packed(tower, inner, ctx, policy) -> torch.nn.Module:
    phase = audio_cost(tower, policy)
    n_window = int(tower.config.n_window)
    mel = int(tower.config.num_mel_bins)

    chunked = audio_phase(n_window=n_window)  # the runtime core's chunk terms, one home

    def cost(table: np.ndarray) -> np.ndarray:
        if policy.cost != "modeled":
            return table[:, 2].astype(np.float64)  # the positions the encoder runs
        # each recording its own item: positions, sum of squared chunks, chunks
        return phase.of(*chunked.features(table[:, :1], np.ones(len(table), dtype=np.int64)))

    def forward(self, input_features=None, feature_lens=None, aftercnn_lens=None, **kwargs):
        if not self.equishard_joining and (input_features is None or input_features.numel() == 0):
            return inner(input_features, feature_lens, aftercnn_lens, **kwargs)  # no round
        where = f"{type(self).__name__} (balance_audio)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:
                check_item_inputs(where, (), kwargs, PACKING_KEYS)
                _refuse_per_layer(where, kwargs)
            frames = _frames(feature_lens, input_features, where)
            outs = _output_tokens(self, frames)
            table = np.column_stack(
                [frames, outs, [sum(c) for c in chunked.sequences(frames)]]
            ).reshape(-1, 3)
            table = np.hstack([table, shape_columns((int(input_features.shape[0]),), len(table))])
            row_bytes = input_features.shape[0] * input_features.element_size()
            dtypes = {"features": input_features.dtype}
        except Exception as e:  # every rank raises it: plan_items
            table, row_bytes, refusal, dtypes = None, 0, e, None
        route = plan_round(
            self, table, cost, lambda t: t[:, 0] * float(row_bytes), **ctx, refusal=refusal,
            where=where, kwargs=kwargs, dtypes=dtypes,
        )  # fmt: skip
        if route.src.size == 0:  # no recordings anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(input_features, feature_lens, aftercnn_lens, **kwargs)
        x = route.send(input_features.T, 0, "features")  # one row per frame
        lens = torch.from_numpy(route.table[route.received, 0].copy()).to(x.device)

        def run():
            after = (lens - 1) // 2 + 1  # the stem's positions (the thinker's aftercnn_lens)
            got = inner(x.T, lens, after, **{**kwargs, **route.settings})
            rows = int(route.table[route.received, 1].sum())
            if got.last_hidden_state.shape[0] != rows:
                raise ValueError(
                    f"{where}: the tower made {got.last_hidden_state.shape[0]} output rows for "
                    f"recordings its _get_feat_extract_output_lengths gives {rows}"
                )
            return got

        # timed with the chunks it runs (the cost's terms), not the frames
        seqs = [n for c in chunked.sequences(route.table[route.received, :1]) for n in c]
        out, failure = run_received(route, run, self, phase="audio", items=seqs)
        own = not self.equishard_joining
        return route_home(self, out, x, route, ctx["group"], own, failure, rows=1)

    def join(self) -> torch.Tensor:
        empty = param_zeros(self, (mel, 0))
        return joined(self, empty, torch.zeros(0, dtype=torch.int64), None, return_dict=True)

    return install(tower, forward, join)


def _check_mask(mask, key: str, n: int, frames: int, where: str) -> None:
    """A window mask of the tower's kind: 4-D ``[n, 1, S, S]`` (``attention_mask``) or one
    row of frames per window ``[n, frames]`` (``input_features_mask``)."""
    if mask is None:
        return
    ok = (
        mask.ndim == 4 and mask.shape[0] == n
        if key == "attention_mask"
        else tuple(mask.shape) == (n, frames)
    )
    if not ok:
        want = (
            "[windows, 1, positions, positions]"
            if key == "attention_mask"
            else (f"[{n}, {frames}]")
        )
        raise ValueError(
            f"{where}: {key} of shape {tuple(mask.shape)} for {n} windows of {frames} frames; "
            f"give {want}, or none"
        )


def _balance_padded(tower, inner, ctx, policy, key: str) -> torch.nn.Module:
    """``key``: the tower's window mask, ``attention_mask`` (4-D) or ``input_features_mask``
    (each window's frames: Audio Flamingo 3, Qwen3-ASR)."""
    phase = audio_cost(tower, policy)

    def cost(table: np.ndarray) -> np.ndarray:  # every window padded to the same length
        n = table[:, 1].astype(np.float64)  # positions after the stem
        return phase.of(n, n * n, 1.0) if policy.cost == "modeled" else n

    def forward(self, input_features=None, *args, **kwargs):
        given = args[0] if args else kwargs.pop(key, None)  # Gemma 3n passes it positionally
        call = lambda x, m, kw: inner(x, **{key: m}, **kw)  # noqa: E731
        if not self.equishard_joining and (input_features is None or len(input_features) == 0):
            return call(input_features, given, kwargs)  # no round: see hf.rounds
        where = f"{type(self).__name__} (balance_audio)"
        refusal = None
        try:
            if policy.enabled:
                check_item_inputs(where, args[1:], kwargs, PACKING_KEYS)
                _refuse_per_layer(where, kwargs)
            if input_features.ndim != 3:
                raise ValueError(
                    f"{where} was given input features of shape {tuple(input_features.shape)}; "
                    "give [windows, mel bins, frames]"
                )
            n, _, frames = input_features.shape
            _check_mask(given, key, n, int(frames), where)
            positions = (int(frames) - 1) // 2 + 1
            table = np.column_stack([np.ones(n), np.full(n, positions)]).astype(np.int64)
            table = np.hstack([table, np.full((n, 1), int(given is not None))])
            table = np.hstack([table, shape_columns(tuple(input_features.shape[1:]), n)])
            row_bytes = input_features[0].numel() * input_features.element_size() if n else 0
            # the same names on every rank (the item table's columns): None without a mask
            mask_dtype = given.dtype if given is not None else None
            dtypes = {"features": input_features.dtype, "mask": mask_dtype}
        except Exception as e:
            table, row_bytes, refusal, dtypes = None, 0, e, None
        route = plan_round(
            self, table, cost, lambda t: t[:, 0] * float(row_bytes), **ctx, refusal=refusal,
            where=where, kwargs=kwargs, dtypes=dtypes,
        )  # fmt: skip
        if route.src.size == 0:
            if self.equishard_joining:
                return None
            return call(input_features, given, kwargs)
        _same_windows(route, where)
        shape = tuple(int(d) for d in route.table[0, 4 : 4 + int(route.table[0, 3])])
        if not len(input_features):  # a joining rank receives windows of the senders' shape
            input_features = input_features.new_zeros((0, *shape))
        x = route.send(input_features, 0, "features")
        mask = None
        if route.table[: route.items, 2].any():  # a rank without a mask: every position counts
            mask = given if given is not None else _open_mask(route, shape, key)
            mask = route.send(mask, 0, "mask")
        out, failure = run_received(
            route,
            lambda: call(x, mask, {**kwargs, **route.settings}),
            self,
            phase="audio",
            items=route.table[route.received, 1].tolist(),  # each window's whole positions
            padded=True,
        )
        own = not self.equishard_joining
        return route_home(self, out, x, route, ctx["group"], own, failure)

    def join(self) -> torch.Tensor:
        empty = param_zeros(self, (0, int(self.config.num_mel_bins), 0))
        return joined(self, empty, return_dict=True)

    return install(tower, forward, join)


def _same_windows(route, where: str) -> None:
    """Every window of the round padded to one length: the encoder takes no other."""
    shapes = {tuple(r) for r in route.table[: route.items, 3:].tolist()}
    if len(shapes) > 1:
        raise ValueError(
            f"{where}: windows of different lengths on different ranks; a padded encoder "
            "takes one window length (its feature extractor's chunk_length)"
        )


def _open_mask(route, shape, key: str) -> torch.Tensor:
    """Masks for this rank's windows where it gave none, in the dtype the other ranks' masks
    have: every frame counts (ones in a frame mask), every position attends (True in a
    boolean attention mask, 0 in an additive one)."""
    n = int((route.src[: route.items] == route.rank).sum())
    dtype = route.dtypes.get("mask", torch.bool)
    if key != "attention_mask":
        return torch.ones((n, int(shape[-1])), dtype=dtype)
    positions = (int(shape[-1]) - 1) // 2 + 1
    if dtype == torch.bool:
        return torch.ones((n, 1, positions, positions), dtype=torch.bool)
    return torch.zeros((n, 1, positions, positions), dtype=dtype)


def balance_audio(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a Whisper-style audio tower (see the module doc):
    packed recordings with ``feature_lens`` (Qwen2.5-Omni) or padded windows (Qwen2-Audio).
    Returns the tower; ``tower.last_route`` holds the latest plan."""
    policy = policy or RedistributePolicy()
    inner = tower.forward
    takes = inspect.signature(inner).parameters
    ctx = {"group": group, "topology": topology, "policy": policy}
    cfg = getattr(tower, "config", None)
    if getattr(cfg, "n_window_infer", None) or (
        "feature_lens" in takes and "aftercnn_lens" not in takes
    ):  # Qwen3-Omni, Qwen3-ASR: attention windows of n_window_infer frames across chunks
        raise ValueError(
            f"{type(tower).__name__} runs attention windows other than Qwen2.5-Omni's chunks "
            "or whole padded windows (n_window_infer), whose cost, call and outputs "
            "equishard does not model yet; balance the decoder only (balance_model(..., "
            "encoder=False))"
        )
    if "feature_lens" in takes and hasattr(tower, "_get_feat_extract_output_lengths"):
        if not getattr(cfg, "n_window", None):
            raise ValueError(
                f"{type(tower).__name__} takes feature_lens but its config has no n_window "
                "(its chunk size), which its cost needs; balance the decoder only"
            )
        return _balance_packed(tower, inner, ctx, policy)
    for key in ("attention_mask", "input_features_mask"):
        if key in takes and getattr(cfg, "num_mel_bins", None):
            return _balance_padded(tower, inner, ctx, policy, key)
    raise ValueError(
        f"{type(tower).__name__}: not a Whisper-style audio tower equishard knows (packed "
        "recordings with feature_lens, or padded windows with attention_mask); balance the "
        "decoder only (balance_model(..., encoder=False)) or open an issue naming the model"
    )
