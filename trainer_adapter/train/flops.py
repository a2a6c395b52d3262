"""Model FLOPs of a training step, for throughput and MFU figures.

Counted for the work the model must do on the real tokens (padding excluded): every matrix
product of the encoders (patch embedding, blocks; the audio encoder's stem, blocks and
projection), the projector and the LLM (blocks; the LM head
at the positions it runs on, those with a target, where the loss picks them), and attention over
each segment (an image unit in the encoder, a sample in the LLM; causal
attention counts the half of the score matrix it computes). Training is three times the
forward (backward = 2x forward); recomputation is not counted, as MFU conventions do
(PaLM, Appendix B; torchtitan).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer_adapter.train.model import VLMConfig

__all__ = ["audio_forward_flops", "block_forward_flops", "training_flops"]


def block_forward_flops(
    tokens: int, sum_sq: float, hidden: int, mlp_ratio: int, *, causal: bool
) -> float:
    """Forward FLOPs of one transformer block over ``tokens`` tokens whose attention segments'
    squared lengths add up to ``sum_sq``: qkv, output and MLP products (2 FLOPs per
    multiply-add) plus scores and weighted values (2 x 2 x hidden per query-key pair)."""
    linear = 2.0 * (4 + 2 * mlp_ratio) * hidden * hidden * tokens
    attention = 4.0 * hidden * sum_sq * (0.5 if causal else 1.0)
    return linear + attention


def training_flops(
    cfg: VLMConfig,
    llm_lens: Sequence[int],
    unit_patches: Sequence[int] = (),
    *,
    targets: int | None = None,
    audio_frames: Sequence[int] = (),
) -> float:
    """FLOPs of forward + backward over samples of ``llm_lens`` tokens, image units of
    ``unit_patches`` encoder patches each and recordings of ``audio_frames`` feature frames
    each (the model's audio encoder: :func:`audio_forward_flops`). ``targets``: the positions
    the LM head runs on (the trainer's loss runs it at the positions with a next-token target
    only: not at image tokens, prompts or a sample's last token); None: every token."""
    t = float(sum(llm_lens))
    fwd = cfg.llm_layers * block_forward_flops(
        int(t), float(sum(n * n for n in llm_lens)), cfg.llm_hidden, cfg.mlp_ratio, causal=True
    )
    head = t if targets is None else float(targets)
    fwd += 2.0 * cfg.llm_hidden * cfg.vocab_size * head  # LM head
    p = float(sum(unit_patches))
    if p:
        fwd += 2.0 * cfg.patch_dim * cfg.vit_hidden * p
        fwd += cfg.vit_layers * block_forward_flops(
            int(p),
            float(sum(n * n for n in unit_patches)),
            cfg.vit_hidden,
            cfg.mlp_ratio,
            causal=False,
        )
        m2 = cfg.merge * cfg.merge  # projector: merged patches to LLM width, then LLM width
        fwd += 2.0 * (cfg.vit_hidden * m2 + cfg.llm_hidden) * cfg.llm_hidden * (p / m2)
    if len(audio_frames):
        if cfg.audio is None:
            raise ValueError("recordings given, but the model has no audio encoder")
        fwd += audio_forward_flops(cfg.audio, audio_frames)
    return 3.0 * fwd


def audio_forward_flops(audio, frames: Sequence[int]) -> float:
    """Forward FLOPs of the audio encoder (:mod:`trainer_adapter.train.audio_encoder`) over
    recordings of ``frames`` frames: its stem's two convolutions over the frames it runs (a
    padded encoder: the whole window of every recording), its blocks over each attention
    sequence (the chunks, or the window) and its projection of the output tokens."""
    from dataprep.media_rules.whisper_audio import audio_tokens, chunk_positions

    if audio.padded:
        run = [audio.window_frames] * len(frames)
        seqs = [(audio.window_frames - 1) // 2 + 1] * len(frames)
    else:
        run = list(frames)
        seqs = [p for f in frames for p in chunk_positions(int(f), audio.n_window)]
    h = audio.hidden
    positions = float(sum(seqs))
    out = 2.0 * audio.mel * 3 * h * float(sum(run)) + 2.0 * h * 3 * h * positions
    out += audio.layers * block_forward_flops(
        int(positions), float(sum(n * n for n in seqs)), h, audio.mlp_ratio, causal=False
    )
    return out + 2.0 * h * audio.out_dim * float(sum(audio_tokens(int(f)) for f in frames))
