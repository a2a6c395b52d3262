"""A small but real vision-language model in plain PyTorch, built for packed variable lengths.

* ``VisionEncoder``: a ViT over per-image (or per-tile) patch sequences — patch embedding, 2-D
  learned positions from each unit's patch grid, pre-norm transformer blocks with bidirectional
  attention inside each unit (units of one grid shape are batched).
* ``Projector``: pixel shuffle (merge ``m x m`` neighbouring patches, as InternVL's 0.5
  downsample and Qwen2-VL's 2x2 merge do) and an MLP into the LLM's width, so each unit yields
  exactly the image tokens the vision policy counted.
* ``LanguageModel``: token + position embeddings, decoder blocks with causal attention inside
  each packed sample (``trainer_adapter.train.attention``: one varlen flash-attention call per row
  on a GPU in bf16, else SDPA per sample; cost follows sum(len^2), not the padded length), final
  norm and LM head.

Sizes go from ``tiny`` (tests, CPU) to ``1b`` (GPU) through :meth:`VLMConfig.preset`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from equishard.common.values import check_count
from trainer_adapter.train.blocks import Block, compile_blocks
from trainer_adapter.train.config import MODEL_SIZES

__all__ = [
    "MODEL_SIZES",
    "Block",
    "LanguageModel",
    "Projector",
    "VLMConfig",
    "VisionEncoder",
    "VisionLanguageModel",
    "compile_blocks",
]

_PRESETS = {
    # vit hidden, layers, heads; llm hidden, layers, heads
    "tiny": (32, 2, 2, 64, 4, 2),
    "small": (256, 6, 4, 512, 8, 8),
    "1b": (1024, 24, 16, 2048, 16, 16),
}
assert tuple(_PRESETS) == MODEL_SIZES  # equishard train --model: named in .config


@dataclass(frozen=True, kw_only=True, slots=True)
class VLMConfig:
    vocab_size: int
    patch_dim: int = 3 * 14 * 14
    merge: int = 2
    vit_hidden: int = 32
    vit_layers: int = 2
    vit_heads: int = 2
    llm_hidden: int = 64
    llm_layers: int = 4
    llm_heads: int = 2
    max_positions: int = 32768
    mlp_ratio: int = 4
    # an audio encoder beside the vision one (trainer_adapter.train.audio_encoder.AudioConfig,
    # its out_dim the LLM's width): its output tokens fill the audio token's slots
    audio: object | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "patch_dim",
            "merge",
            "vit_hidden",
            "vit_layers",
            "llm_hidden",
            "llm_layers",
            "max_positions",
            "mlp_ratio",
            "vit_heads",
            "llm_heads",
        ):
            check_count(name, getattr(self, name), 1, (1 << 31) - 1)
        for h, n, what in (
            (self.vit_hidden, self.vit_heads, "vit"),
            (self.llm_hidden, self.llm_heads, "llm"),
        ):
            if n < 1 or h % n:
                raise ValueError(f"{what}_hidden {h} must be a multiple of {what}_heads {n}")
        if self.audio is not None:
            from trainer_adapter.train.audio_encoder import AudioConfig

            if not isinstance(self.audio, AudioConfig):
                raise ValueError(f"audio must be an AudioConfig or None, got {self.audio!r}")
            if self.audio.out_dim != self.llm_hidden:
                raise ValueError(
                    f"the audio encoder's out_dim {self.audio.out_dim} must be the LLM's width "
                    f"llm_hidden={self.llm_hidden} (its tokens take the audio slots)"
                )
        if self.vit_hidden % 4:
            raise ValueError(
                f"vit_hidden {self.vit_hidden} must be a multiple of 4 (a sine and a cosine "
                "for the row and for the column of each patch)"
            )

    @classmethod
    def preset(cls, name: str, **overrides) -> VLMConfig:
        if name not in _PRESETS:
            raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(_PRESETS)}")
        vh, vl, vn, lh, ll, ln = _PRESETS[name]
        base = cls(
            vocab_size=overrides.pop("vocab_size"),
            vit_hidden=vh,
            vit_layers=vl,
            vit_heads=vn,
            llm_hidden=lh,
            llm_layers=ll,
            llm_heads=ln,
        )
        return replace(base, **overrides)


def merge_for_policy(policy) -> int:
    """The patch merge that turns a vision policy's encoder patches into its LLM tokens."""
    from dataprep.policies import FixedPolicy, InternVLPolicy, Qwen2VLPolicy

    if isinstance(policy, FixedPolicy):
        return 1
    if isinstance(policy, InternVLPolicy):
        return round(1 / policy.downsample_ratio)
    if isinstance(policy, Qwen2VLPolicy):
        return policy.merge_size
    raise ValueError(f"no patch merge known for {type(policy).__name__}")


def grid_positions(h: int, w: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[h*w, dim] fixed 2-D sine-cosine positions of an h x w patch grid in row-major order:
    half the channels encode the row, half the column (MAE's form). No table, so no largest
    grid: a native-resolution policy's image of any shape is encoded."""
    quarter = dim // 4
    freq = 1.0 / 10000 ** (torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    grid = torch.arange(h * w, device=device)
    parts = []
    for pos in (grid // w, grid % w):
        angle = pos.to(torch.float32)[:, None] * freq[None, :]
        parts += [angle.sin(), angle.cos()]
    return torch.cat(parts, dim=1)


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.vit_hidden)
        self.blocks = nn.ModuleList(
            Block(cfg.vit_hidden, cfg.vit_heads, cfg.mlp_ratio, causal=False)
            for _ in range(cfg.vit_layers)
        )
        self.norm = nn.LayerNorm(cfg.vit_hidden)

    def forward(self, patches: torch.Tensor, units_hw: torch.Tensor) -> torch.Tensor:
        """[P, patch_dim] patches of units with grids ``units_hw`` [U, 2] -> [P, vit_hidden]."""
        x = self.patch_embed(patches)
        if units_hw.shape[0] == 0:
            return self.norm(x)
        hw = units_hw.tolist()
        starts = [0]
        for h, w in hw:
            starts.append(starts[-1] + h * w)
        out = None  # the blocks' output dtype (fp32 residuals, also under bf16 autocast)
        shapes: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(hw):
            shapes.setdefault(tuple(s), []).append(i)
        # every group's rows in one copy, not blocking the host (a blocking copy per group
        # would wait for the previous groups' blocks to run: a host sync mid-step)
        index = torch.cat(
            [torch.arange(starts[i], starts[i + 1]) for ids in shapes.values() for i in ids]
        )
        pinned = index.pin_memory() if x.is_cuda else index
        index = pinned.to(x.device, non_blocking=x.is_cuda)
        at = 0
        for (h, w), ids in shapes.items():
            rows = index[at : at + len(ids) * h * w]
            at += len(ids) * h * w
            y = x[rows].view(len(ids), h * w, -1) + grid_positions(h, w, x.shape[1], x.device)
            for blk in self.blocks:
                y = blk(y)
            y = y.reshape(len(ids) * h * w, -1)
            out = (y.new_empty(x.shape[0], y.shape[1]) if out is None else out).index_copy(
                0, rows, y
            )
        return self.norm(out)


class Projector(nn.Module):
    """Pixel shuffle by ``merge`` and an MLP: [P, vit_hidden] -> [P / merge^2, llm_hidden]."""

    def __init__(self, cfg: VLMConfig) -> None:
        super().__init__()
        self.m = cfg.merge
        d = cfg.vit_hidden * cfg.merge**2
        self.mlp = nn.Sequential(
            nn.LayerNorm(d),
            nn.Linear(d, cfg.llm_hidden),
            nn.GELU(),
            nn.Linear(cfg.llm_hidden, cfg.llm_hidden),
        )

    def forward(self, x: torch.Tensor, units_hw: torch.Tensor) -> torch.Tensor:
        m, c = self.m, x.shape[-1]
        parts, start = [], 0
        for h, w in units_hw.tolist():
            if h % m or w % m:
                raise ValueError(f"a {h}x{w} patch grid does not merge by {m}x{m}")
            u = x[start : start + h * w].view(h // m, m, w // m, m, c)
            parts.append(u.permute(0, 2, 1, 3, 4).reshape(h * w // (m * m), m * m * c))
            start += h * w
        merged = torch.cat(parts) if parts else x.new_zeros(0, m * m * c)
        return self.mlp(merged)


class LanguageModel(nn.Module):
    """``keep`` (a pipeline rank's share): called with ``"tok"``, ``"pos"``, ``"block{i}"``,
    ``"norm"``, ``"head"``; a part it refuses is dropped right after it is built (an
    ``nn.Identity`` stands in), so the random numbers drawn, and with them every kept part's
    initial values, are those of the whole model from the same seed, while memory holds at most
    the kept parts and one more."""

    def __init__(self, cfg: VLMConfig, keep=None) -> None:
        super().__init__()
        self.cfg = cfg

        def part(name, make):
            mod = make()
            return mod if keep is None or keep(name) else nn.Identity()

        self.tok = part("tok", lambda: nn.Embedding(cfg.vocab_size, cfg.llm_hidden))
        self.pos = part("pos", lambda: nn.Embedding(cfg.max_positions, cfg.llm_hidden))
        self.blocks = nn.ModuleList(
            part(f"block{i}", lambda: Block(cfg.llm_hidden, cfg.llm_heads, cfg.mlp_ratio, True))
            for i in range(cfg.llm_layers)
        )
        self.norm = part("norm", lambda: nn.LayerNorm(cfg.llm_hidden))
        self.head = part("head", lambda: nn.Linear(cfg.llm_hidden, cfg.vocab_size))

    def embed(
        self, input_ids, position_ids, image_embeds, image_token_id: int, extra=()
    ) -> torch.Tensor:
        """Token + position embeddings, image tokens replaced by ``image_embeds`` in order
        (and each ``(embeds, token_id)`` of ``extra``, another encoder's: an audio encoder's
        tokens in its slots). The inputs are checked while they are on the host
        (``check_inputs``): on a GPU the trainer checks them before the copy, so the step has
        no device-to-host sync here."""
        if not input_ids.is_cuda:
            self.check_inputs(input_ids, position_ids, image_embeds.shape[0], image_token_id)
            for emb, token in extra:
                self.check_inputs(input_ids, position_ids, emb.shape[0], token, "audio")
        x = self.tok(input_ids)
        # with no image tokens the (empty) embeddings stay in the graph: their backward is a
        # collective that every rank must join
        for emb, token in ((image_embeds, image_token_id), *extra):
            x = x.masked_scatter((input_ids == token).unsqueeze(-1), emb.to(x.dtype))
        return x + self.pos(position_ids)

    def check_inputs(
        self, input_ids, position_ids, n_embeds: int, token_id: int, what: str = "image"
    ):
        if position_ids.numel() and int(position_ids.max()) >= self.cfg.max_positions:
            raise ValueError(f"a sample is longer than max_positions={self.cfg.max_positions}")
        n_slots = int((input_ids == token_id).sum())
        if n_slots != n_embeds:
            raise ValueError(f"{n_slots} {what} tokens but {n_embeds} {what} embeddings")

    def forward_blocks(self, x, seg_lens: list[int], lo: int = 0, hi: int | None = None):
        for blk in self.blocks[lo:hi]:
            x = blk(x, seg_lens)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


class VisionLanguageModel(nn.Module):
    def __init__(self, cfg: VLMConfig, keep_llm=None) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg)
        self.projector = Projector(cfg)
        self.llm = LanguageModel(cfg, keep=keep_llm)
        self.audio = None
        if cfg.audio is not None:  # built last: the other parts' initial values stay as without
            from trainer_adapter.train.audio_encoder import AudioEncoder

            self.audio = AudioEncoder(cfg.audio)

    def encode_images(self, patches: torch.Tensor, units_hw: torch.Tensor) -> torch.Tensor:
        """Image-token embeddings, unit by unit: [sum over units of h*w/merge^2, llm_hidden]."""
        return self.projector(self.vision(patches, units_hw), units_hw)


def shifted_labels(labels: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Next-token targets inside each packed sample (the last token of a sample predicts none)."""
    out = torch.roll(labels, -1)
    if labels.numel():
        out[(cu_seqlens[1:].long() - 1)[cu_seqlens[1:] > cu_seqlens[:-1]]] = -100
    return out
