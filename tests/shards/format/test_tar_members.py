"""Tar member encoding: the cached ustar header is exactly what ``tarfile`` writes."""

import io
import tarfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shards.format.tar_members import _tarinfo, add_member, sample_key, ustar_header

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


# ---------------------------------------------------------------- members -> samples, as webdataset
_NAMES = st.builds(
    lambda d, key, suffix: f"{d}{key}{suffix}",
    st.sampled_from(["", "d/", "a.b/", "__x__/"]),
    st.sampled_from(["k1", "k2", "K1", "__meta__", "__k.json__", "k.1", "k_2-x"]),
    st.sampled_from(["", ".json", ".jpg", ".JPG", ".tar.gz", ".a.B", "."]),
)


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMES, st.binary(max_size=40)), max_size=12))
@example([("__k.json__", b"x"), ("k1.json", b"{}"), ("d/__k.json__", b"y")])  # meta names
def test_the_reader_splits_members_into_samples_as_webdataset_does(members):
    """Reference: webdataset's own ``tar_file_iterator`` + ``group_by_keys`` on the same bytes
    (keys up to the first dot, lower-cased suffixes, meta members and suffix-less names skipped,
    a repeated suffix an error). Catches a reader whose samples differ from what users' webdataset
    pipelines read from the same shards."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    from shards.read.reader import _members, split_samples

    data = _tar(members)

    def ours():
        return split_samples(_members(data, "here"), "u")

    def theirs():
        files = ({**m, "__url__": "u"} for m in tar_file_iterator(io.BytesIO(data)))
        return list(group_by_keys(files))

    try:
        want = theirs()
    except ValueError:
        with pytest.raises(ValueError, match="duplicate file name"):
            ours()
        return
    assert ours() == want


def test_a_sparse_member_is_refused_by_name():
    """A GNU sparse member's stored bytes are not its content (readers expand its map); the
    writer never makes one, so the reader refuses it instead of slicing the wrong bytes."""
    from shards.read.reader import ShardError, _members

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("k.json")
        info.size = 4
        info.type = tarfile.GNUTYPE_SPARSE
        tf.addfile(info, io.BytesIO(b"{}  "))
    with pytest.raises(ShardError, match=r"'k\.json' is a sparse file"):
        _members(buf.getvalue(), "shard-0.tar")


@pytest.mark.parametrize("length", [99, 100, 101, 155, 156, 257])
@pytest.mark.parametrize("size", [0, 1, 8**11 - 1, 8**11])
def test_ustar_header_at_the_name_and_size_boundaries(length, size):
    """The boundaries hypothesis rarely draws: a 101-byte name written into the 100-byte field
    would run into the mode field (the fast path must hand it to tarfile)."""
    name = ("n" * length)[:length]
    got = ustar_header(name, size)
    want = _tarinfo(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert got == want if got is not None else (length > 100 or size >= 8**11)
    assert (got is None) == (length > 100 or size >= 8**11)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF"])
def test_image_ext_names_what_pillow_wrote(fmt):
    """Reference: the format Pillow wrote (and reads back): the member's suffix tells webdataset's
    decoders which codec to use."""
    from PIL import Image

    from dataprep.errors import SampleRejected
    from shards.format.tar_members import image_ext

    buf = io.BytesIO()
    Image.new("RGB", (7, 5), (1, 2, 3)).save(buf, format=fmt)
    data = buf.getvalue()
    assert Image.open(io.BytesIO(data)).format == fmt
    want = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp"}.get(fmt)
    if want is None:
        with pytest.raises(SampleRejected, match=r"not JPEG"):
            image_ext(data)
    else:
        assert image_ext(data) == want


def test_a_member_ending_exactly_at_the_groups_end_is_read_whole():
    """A member whose size is a multiple of 512 has no padding: in a group's byte range it can
    end exactly where the range ends (no end-of-archive blocks inside a group), and is whole."""
    from shards.read.reader import _members

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        add_member(tf, "k.json", b"{}")
        add_member(tf, "k.0.png", b"p" * 1024)
    data = buf.getvalue()
    end = 3 * 512 + 1024  # two headers, the json's padded block, the image's two blocks
    got = _members(data[:end], "test")
    assert got == [("k.json", b"{}"), ("k.0.png", b"p" * 1024)]
