"""shards: balanced WebDataset shard writer and streaming loader (issue 4, not built yet)."""

__all__: list[str] = []
