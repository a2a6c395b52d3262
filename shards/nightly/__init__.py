"""The nightly rebalance: measure the day's inputs, balance them incrementally against the parent
generation, write and publish the next generation, resumable after a kill."""
