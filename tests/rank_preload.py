"""What the ranks' fork server (tests/dist_helper.py) loads once for the whole test session, so
that no rank pays for it again: each rank is forked from this state.

Measured on a 2-core machine, a rank of a Hugging Face test spent ~4.4 s of its ~5 s before
its first step importing ``transformers.modeling_utils`` (which pulls in torch's DTensor,
``torch._dynamo``, generation, masking and loss utilities) and equishard's packages, times 2-4
ranks per test on 2 cores; and with an empty numba cache (a fresh clone) every rank's first
balancing call compiled the runtime kernels in a child of its own.

Only imports and numba kernels run here, no torch computation: the fork server must stay a
single-threaded process (a process forked after OpenMP started its threads can hang in its
first parallel region). A module that fails to import is left out: the ranks import it
themselves, as before.
"""

from __future__ import annotations

import contextlib
import importlib

MODULES = (
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "numpy",
    "transformers",
    "transformers.modeling_utils",
    "transformers.processing_utils",
    # what building any model or processor imports beyond these (~0.1 s a rank)
    "transformers.modeling_layers",
    "transformers.generation.utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.processing_auto",
    "transformers.models.auto.image_processing_auto",
    "transformers.models.auto.tokenization_auto",
    "balancing",
    "dataprep",
    "shards",
    "trainer_adapter",
    "trainer_adapter.hf",
    "trainer_adapter.train",
)

for _name in MODULES:
    with contextlib.suppress(Exception):
        importlib.import_module(_name)

# the runtime kernels, loaded from numba's cache or compiled into it once (not in every rank);
# numba runs no threads of its own for these kernels, so forking after this is safe
with contextlib.suppress(Exception):
    from balancing.first_call import warm_up

    warm_up()
