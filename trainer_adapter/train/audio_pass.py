"""One step's audio encoder pass in the reference trainer: this rank's recordings (its share
after :func:`trainer_adapter.redistribute`'s audio phase) through the audio encoder, their
output tokens sent to their samples' LLM ranks, and after the LLM's backward the reverse: the
tokens' gradients home, then the encoder's backward, apart, so that each phase's time is its
own work (as the trainer does for the images)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["AudioPass", "audio_backward", "encode_audio"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AudioPass:
    """The encoder's output, its leaf (where the LLM's gradient arrives), the tokens sent to
    the LLM ranks and their leaf here (what the LLM embeds), and the audio token id."""

    out: torch.Tensor
    leaf: torch.Tensor
    sent: torch.Tensor
    here: torch.Tensor
    token: int


def encode_audio(encoder, local, route, device, dtype, timer) -> AudioPass | None:
    """The pass over ``local.encoders["audio"]``; None for a model without an audio encoder
    (``encoder`` None) or a batch without the phase."""
    enc = local.encoders.get("audio")
    if encoder is None or enc is None:
        return None
    lens = enc.units[:, 0].tolist()
    # timed with the sequences it runs (the chunks, or each recording's whole window), the
    # items the runtime prices: a calibration fitted to them prices what the plan balances
    seqs = [n for f in lens for n in encoder.sequences(int(f))]
    with timer.phase("audio", items=seqs, padded=encoder.cfg.padded):
        out = encoder(enc.payload.to(device, dtype), lens)
    leaf = out.detach().requires_grad_(out.requires_grad)
    t_x = time.perf_counter()
    sent = route.send_embeddings("audio", leaf)
    timer.wait("exchange", time.perf_counter() - t_x)
    here = sent.detach().requires_grad_(sent.requires_grad)
    return AudioPass(out=out, leaf=leaf, sent=sent, here=here, token=enc.token_id)


def audio_backward(a: AudioPass, timer) -> None:
    """The audio tokens' gradients back to the ranks that encoded them (a collective: every
    rank runs it), then the audio encoder's backward."""
    t_x = time.perf_counter()
    if a.sent.requires_grad:
        a.sent.backward(a.here.grad if a.here.grad is not None else torch.zeros_like(a.sent))
    timer.wait("exchange", time.perf_counter() - t_x)
    if a.out.requires_grad:
        with timer.phase("audio"):
            a.out.backward(a.leaf.grad if a.leaf.grad is not None else torch.zeros_like(a.out))
