"""trainer_adapter: runtime DP redistribution and pipelined training (issue 5, not built yet)."""

__all__: list[str] = []
