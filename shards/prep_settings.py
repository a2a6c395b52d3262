"""``shards.prep_settings``, as equishard 0.1 laid it out: the same names as :mod:`shards.read.prep_settings`
(kept for code that imports them from here; new code imports that module)."""

from shards.read.prep_settings import (
    PrepSettings,
    SettingsMismatch,
)

__all__ = ["PrepSettings", "SettingsMismatch"]
