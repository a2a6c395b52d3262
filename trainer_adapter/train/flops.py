"""Model FLOPs of a training step, for throughput and MFU figures.

Counted for the work the model must do on the real tokens (padding excluded): every matrix
product of the encoder (patch embedding, blocks), the projector and the LLM (blocks; the LM head
at the positions it runs on, those with a target, where the loss picks them), and attention over
each segment (an image unit in the encoder, a sample in the LLM; causal
attention counts the half of the score matrix it computes). Training is three times the
forward (backward = 2x forward); recomputation is not counted, as MFU conventions do
(PaLM, Appendix B; torchtitan).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer_adapter.train.model import VLMConfig

__all__ = ["block_forward_flops", "training_flops"]


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
) -> float:
    """FLOPs of forward + backward over samples of ``llm_lens`` tokens and image units of
    ``unit_patches`` encoder patches each. ``targets``: the positions the LM head runs on (the
    trainer's loss runs it at the positions with a next-token target only: not at image
    tokens, prompts or a sample's last token); None: every token."""
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
    return 3.0 * fwd
