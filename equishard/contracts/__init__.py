"""The contracts between the stages, one module each, each one type that both writes and reads:

- :mod:`~equishard.contracts.columns`: the column names of the cost table and the plan;
- :mod:`~equishard.contracts.cost_table`: the cost table (schema, metadata, reading, checks);
- :mod:`~equishard.contracts.plan`: the plan (schema, file names);
- :mod:`~equishard.contracts.generation`: a generation (every file name of one, the manifest's
  dataclasses with ``to_json``/``from_json``).

They stand on :mod:`equishard.common` only; the stages import them, never the other way round.
This package imports none of its modules (the loader reads the generation's contract without
loading pyarrow): import the module you need.
"""
