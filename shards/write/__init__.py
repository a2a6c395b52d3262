"""Writing a generation: the plan checked against the cost table, one stream per rank written by
worker processes (resumable), shards reused from a parent, the wids index and Energon's
metadata, atomic publish."""
