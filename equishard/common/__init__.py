"""The ground floor every stage stands on and none owns: checks on values from outside
(:mod:`~equishard.common.values`), reading local files safely (:mod:`~equishard.common.local_files`),
durable writes (:mod:`~equishard.common.durable`), worker counts (:mod:`~equishard.common.workers`),
the Ray engine (:mod:`~equishard.common.ray_engine`) and the one error base class
(:mod:`~equishard.common.errors`).

A module here imports nothing from a stage (``dataprep``, ``balancing``, ``shards``,
``trainer_adapter``) nor from the command line; ``tests/test_layout.py`` checks it.
"""

from equishard.common.errors import EquishardError, describe

__all__ = ["EquishardError", "describe"]
