"""Tar member encoding: the cached ustar header is exactly what ``tarfile`` writes."""

import io
import tarfile

from hypothesis import given, settings
from hypothesis import strategies as st

from shards.tar_members import _tarinfo, add_member, sample_key, ustar_header

names = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=140
)
sizes = st.one_of(st.integers(0, 4096), st.integers(0, 8**11 + 10), st.just(8**11 - 1))


@settings(max_examples=400, deadline=None)
@given(name=names, size=sizes)
def test_ustar_header_equals_tarfiles_pax_header(name, size):
    got = ustar_header(name, size)
    want = _tarinfo(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    if got is None:  # non-ASCII, over 100 bytes or 8 GiB: left to tarfile
        assert not name.isascii() or len(name) > 100 or size >= 8**11
    else:
        assert got == want


def test_members_read_back_with_tarfile():
    buf = io.BytesIO()
    payloads = {
        sample_key(3, 0, "a.b/c") + ".json": b"{}",
        "x" * 100: b"1" * 513,
        "long/" + "y" * 150 + ".png": b"2" * 70_000,  # PAX path header
        "caf\u00e9.jpg": b"3",
    }
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in payloads.items():
            add_member(tf, name, data)
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r:") as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf}
        assert all(m.mtime == 0 and m.mode == 0o644 and m.uid == 0 for m in tf.getmembers())
    assert got == payloads
    assert sample_key(3, 0, "a.b/c") == "0000003_000_a_b_c"
