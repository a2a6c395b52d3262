"""Reading a generation: the deterministic, resumable loader (GroupDataset), the tar-group reader,
the collator, peer readers' views (HF datasets), verify and report."""
