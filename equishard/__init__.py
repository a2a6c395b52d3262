"""equishard: balanced, node-aware WebDataset shards for vision-language model training.

The stages live in the top-level packages ``dataprep``, ``balancing``, ``shards`` and
``trainer_adapter``; this package holds the version, the ground floor every stage stands on
(:mod:`equishard.common`: value checks, local files, workers, the Ray engine, the error base
class), the contracts between the stages (:mod:`equishard.contracts`) and the ``equishard``
command line (:mod:`equishard.cli`).
"""

__version__ = "0.1.0"
