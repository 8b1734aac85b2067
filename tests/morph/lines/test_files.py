"""morph/lines/files.py: WAV headers byte for byte (RIFF, and RF64 past 4 GiB, read back from a sparse file), atomic
writes whatever stops them, and the disk check before a job."""

import struct
from collections import namedtuple

import numpy as np
import pytest
import soundfile as sf

from morph.lines import files
from morph.lines.files import RIFF_LIMIT, LineWriteError, check_space, wav_bytes, wav_header, write_atomic

FMT = struct.pack("<HHIIHH", 3, 1, 24000, 96000, 4, 32)  # IEEE float, mono, 24 kHz, 4 bytes a sample
LARGEST_RIFF = (RIFF_LIMIT - 48) // 4  # samples: RIFF's size field is the file's size less 8, 48 + 4 x samples


@pytest.mark.parametrize("samples", [0, 1, 12345, LARGEST_RIFF])
def test_a_wav_header_is_riff_with_the_file_size_less_8(samples):
    data = 4 * samples
    assert wav_header(samples) == (b"RIFF" + struct.pack("<I", 56 + data - 8) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
                                   + FMT + b"fact" + struct.pack("<II", 4, samples) + b"data" + struct.pack("<I", data))


@pytest.mark.parametrize("samples", [LARGEST_RIFF + 1, 2**32 + 7])
def test_past_riffs_sizes_the_header_is_rf64_with_the_sizes_in_its_ds64_chunk(samples):
    data = 4 * samples
    assert wav_header(samples) == (
        b"RF64" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"ds64" + struct.pack("<I", 28) + struct.pack("<QQQI", 92 + data - 8, data, samples, 0)
        + b"fmt " + struct.pack("<I", 16) + FMT
        + b"fact" + struct.pack("<II", 4, min(samples, 0xFFFFFFFF)) + b"data" + struct.pack("<I", 0xFFFFFFFF))


def test_a_wav_file_is_the_header_and_the_samples_soundfile_reads_back(tmp_path):
    clip = np.random.default_rng(0).uniform(-1, 1, 999).astype(np.float32)
    data = wav_bytes(clip)
    assert data == wav_header(999) + clip.astype("<f4").tobytes()
    (tmp_path / "a.wav").write_bytes(data)
    np.testing.assert_array_equal(sf.read(tmp_path / "a.wav", dtype="float32")[0], clip)


def test_a_dialogue_past_4_gib_is_one_rf64_file_soundfile_reads(tmp_path):
    """Written as the dialogue is (its header for the whole length, then samples), but sparse: the disk holds the
    header and a few samples, and the file still claims over 4 GiB."""
    samples = LARGEST_RIFF + 1000
    head = np.arange(1, 6, dtype="<f4")
    path = tmp_path / "long.wav"

    def write(f):
        f.write(wav_header(samples))
        f.write(head.tobytes())
        f.truncate(92 + 4 * samples)  # the rest: float zeros, never written

    write_atomic(path, write, "test")
    assert path.stat().st_size > 2**32 and list(tmp_path.iterdir()) == [path]
    info = sf.info(str(path))
    assert (info.format, info.subtype, info.frames, info.samplerate, info.channels) == ("RF64", "FLOAT", samples,
                                                                                       24000, 1)
    np.testing.assert_array_equal(sf.read(path, frames=6, dtype="float32")[0], [1, 2, 3, 4, 5, 0])
    np.testing.assert_array_equal(sf.read(path, start=samples - 2, dtype="float32")[0], [0, 0])


# -- whatever stops a write, no partial file -----------------------------------------------------------------------
def test_ctrl_c_during_a_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "x.wav"
    path.write_bytes(b"old")

    def interrupted(f):
        f.write(b"new, but only half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, interrupted, "test")
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == b"old"


def test_an_exclusive_write_never_replaces_a_file_and_leaves_no_temporary_one(tmp_path):
    """exclusive (a saved voice's): a file already at the path stays, FileExistsError as it is, not a write error."""
    path = tmp_path / "v.safetensors"
    write_atomic(path, lambda f: f.write(b"first"), "test", exclusive=True)
    with pytest.raises(FileExistsError) as e:
        write_atomic(path, lambda f: f.write(b"second"), "test", exclusive=True)
    assert not isinstance(e.value, LineWriteError)
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == b"first"
    write_atomic(path, lambda f: f.write(b"third"), "test")  # not exclusive: replaced, as before
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == b"third"


def test_a_write_no_longer_wanted_at_its_rename_is_not_put_in_place(tmp_path):
    path = tmp_path / "x.wav"

    class Gone(RuntimeError):
        pass

    def gone():
        assert [p.name for p in tmp_path.iterdir()][0].endswith(".part")  # written, not yet in place
        raise Gone("no longer ours")

    with pytest.raises(Gone):
        write_atomic(path, lambda f: f.write(b"late"), "test", gone)
    assert list(tmp_path.iterdir()) == []


def test_a_job_that_does_not_fit_on_its_disk_is_refused_with_the_sizes_and_the_fix(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")

    def free(n):
        def disk_usage(folder):
            assert folder == tmp_path  # the disk of the job's folder
            return usage(10**13, 0, n)
        monkeypatch.setattr(files.shutil, "disk_usage", disk_usage)

    free(1_000_000_000)
    check_space(tmp_path, 1_000_000_000, "test", "use another disk")
    with pytest.raises(LineWriteError, match=rf"^test: this job writes about 1.1 GB into {tmp_path}, and its disk has "
                                             r"1.0 GB free; free some space there, or use another disk$"):
        check_space(tmp_path, 1_050_000_000, "test", "use another disk")
    free(999_999)
    with pytest.raises(LineWriteError, match=r"about 1.1 MB into .+ has 1.0 MB free"):
        check_space(tmp_path, 1_050_000, "test", "use another disk")


def test_a_write_makes_its_folders_and_a_failure_of_no_known_kind_gets_the_general_fix(tmp_path, monkeypatch):
    import errno
    import os

    path = tmp_path / "a" / "b" / "x.wav"
    write_atomic(path, lambda f: f.write(b"x"), "test")
    assert path.read_bytes() == b"x"

    def broken(f):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(LineWriteError, match=rf"^test: could not write {path}: Input/output error; check the folder's "
                                             r"permissions and free space, or choose another folder$"):
        write_atomic(path, broken, "test")
