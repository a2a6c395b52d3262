"""How a generation's samples are laid out: tar members and their names, a sample's JSON document,
the digests of group byte ranges, Energon's sample type."""
