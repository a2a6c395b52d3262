"""Where a generation lives and how it is reached: local directories, HTTP and fsspec object stores
(reads with deadlines, listings, the conditional publish of CURRENT), the loader's cache,
retention, and opening a stored generation (its manifest and carried files)."""
