"""balancing: ISF grouping, step assignment and runtime balancing kernels (issue 3, not built yet)."""

__all__: list[str] = []
