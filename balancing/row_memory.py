"""The memory a plan's largest row needs for its logits, against a budget the user gives.

A trainer that packs a group into one row (the Hugging Face packer does) computes the LM head
over every token of it: ``tokens x vocabulary x bytes a logit`` before the loss, often the
largest tensor of the step (7,000 tokens x Qwen's 151,936-token vocabulary x 4 bytes is 4.3 GB
per rank). The group's LLM tokens are capped by ``--llm-tokens-per-group``; ``balance
--row-memory 2GB --vocab-size 151936`` says, after planning, whether the largest group fits,
and the cap that would make it fit. A chunked loss (the reference trainer's) needs only a chunk
of rows' logits at a time: give the chunk's size instead, or no budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from equishard.common.options import option
from equishard.common.values import check_count, parse_size

__all__ = ["LOGIT_BYTES", "MAX_VOCAB", "RowMemory"]

LOGIT_BYTES = (2, 4)  # bf16 logits, fp32 logits (a loss computed in fp32 upcasts them)
MAX_VOCAB = 1 << 24  # far above any model's vocabulary


def _size_or_none(text: str | None) -> int | None:
    return None if text is None else parse_size(text)


@dataclass(frozen=True, kw_only=True)
class RowMemory:
    """A budget for one row's logits: ``row_memory`` bytes for ``vocab_size`` x
    ``logit_bytes`` a token (no budget: nothing checked)."""

    row_memory: int | None = field(
        default=None,
        metadata=option(
            "warn when the largest group, packed into one row, needs more than this for its "
            "logits (tokens x --vocab-size x --logit-bytes; e.g. 2GB), and give the "
            "--llm-tokens-per-group that fits",
            type=str,
            parse=_size_or_none,
            metavar="SIZE",
        ),
    )
    vocab_size: int | None = field(
        default=None,
        metadata=option("the model's vocabulary, for --row-memory (e.g. 151936)", metavar="N"),
    )
    logit_bytes: int = field(
        default=4,
        metadata=option(
            "bytes a logit takes, for --row-memory: 4 (fp32, the default) or 2 (bf16)",
            choices=LOGIT_BYTES,
        ),
    )

    def __post_init__(self) -> None:
        check_count("--row-memory (bytes)", self.row_memory, 1, none=True)
        check_count("--vocab-size", self.vocab_size, 1, MAX_VOCAB, none=True)
        if isinstance(self.logit_bytes, bool) or self.logit_bytes not in LOGIT_BYTES:
            raise ValueError(f"--logit-bytes must be 2 or 4, got {self.logit_bytes!r}")
        if self.row_memory is not None and self.vocab_size is None:
            raise ValueError("--row-memory needs --vocab-size: a row's logits are per token")

    def bytes_for(self, tokens: int) -> int:
        """The logits of a row of ``tokens`` tokens, in bytes."""
        return tokens * self.vocab_size * self.logit_bytes

    @property
    def max_tokens(self) -> int:
        """The most tokens a row may hold within the budget."""
        return self.row_memory // (self.vocab_size * self.logit_bytes)

    def warning(self, largest: int) -> str | None:
        """What to say of a plan whose largest group holds ``largest`` LLM tokens (None: it
        fits, or no budget was given)."""
        if self.row_memory is None or self.bytes_for(largest) <= self.row_memory:
            return None
        need = self.bytes_for(largest)
        return (
            f"the largest group holds {largest} LLM tokens: packed into one row, its logits take "
            f"{largest} x {self.vocab_size} x {self.logit_bytes} bytes = {need / 2**30:.2f} GiB, "
            f"more than --row-memory {self.row_memory / 2**30:.2f} GiB; balance again with "
            f"--llm-tokens-per-group {self.max_tokens} (or compute the loss in chunks of rows)"
        )
