"""equishard: balanced, node-aware WebDataset shards for vision-language model training.

The stages live in the top-level packages ``dataprep``, ``balancing``, ``shards`` and
``trainer_adapter``; this package holds the version and the ``equishard`` command line.
"""

__version__ = "0.1.0"
