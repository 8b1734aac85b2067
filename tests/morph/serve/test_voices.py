"""The server's voice folder: voices kept across restarts, names that cannot leave the folder, saves that are atomic
and never replace a voice, a name reserved while its voice is made, stray files skipped, and a cache that never
serves a replaced file."""

import logging
import os
import threading

import pytest
import torch

from morph.lines import voice as voice_file
from morph.lines.voice import Voice, check_voice, voice_bytes
from morph.serve.voices import VoiceFolder, check_name


def icl_voice(text="A reference sentence.", frames=12) -> bytes:
    return voice_bytes(Voice(torch.randn(64), torch.randint(0, 2048, (frames, 16)), text, "0b6"))


def xvector_voice() -> bytes:
    return voice_bytes(Voice(torch.randn(128), None, None, "1b7"))


def text_of(voice: bytes) -> str | None:
    return check_voice(voice, "test", "v")[2]


def test_save_load_round_trip_and_records(tmp_path):
    folder = VoiceFolder(tmp_path / "voices")  # made if missing
    alice, bob = icl_voice(), xvector_voice()
    record = folder.save("alice", alice)
    folder.save("Bob.v2", bob)
    assert record["name"] == "alice" and record["mode"] == "icl" and record["ref_text"] == "A reference sentence."
    assert record["model_size"] == "0b6" and isinstance(record["created_at"], int)
    assert record["created_at"] == int(os.stat(tmp_path / "voices" / "alice.safetensors").st_mtime)
    assert folder.load("alice") == alice and folder.load("Bob.v2") == bob
    assert folder.records() == [
        {"name": "Bob.v2", "mode": "xvector", "ref_text": None, "model_size": "1b7",
         "created_at": folder.records()[0]["created_at"]},
        record,
    ]


def test_records_are_sorted_by_name(tmp_path):
    folder = VoiceFolder(tmp_path)
    for name in ("b", "a-b", "a", "B"):
        folder.save(name, xvector_voice())
    assert [r["name"] for r in folder.records()] == ["B", "a", "a-b", "b"]


def test_a_restart_sees_the_saved_voices_and_dropped_in_files(tmp_path):
    alice = icl_voice()
    VoiceFolder(tmp_path).save("alice", alice)
    (tmp_path / "from_the_node.safetensors").write_bytes(xvector_voice())  # as the Save Voice node writes it
    again = VoiceFolder(tmp_path)
    assert [r["name"] for r in again.records()] == ["alice", "from_the_node"]
    assert again.load("alice") == alice


def test_a_saved_voice_is_never_replaced(tmp_path):
    folder = VoiceFolder(tmp_path)
    first = icl_voice("first")
    folder.save("v", first)
    with pytest.raises(FileExistsError):
        folder.save("v", xvector_voice())
    assert folder.load("v") == first and VoiceFolder(tmp_path).load("v") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.safetensors"]  # its temporary file is gone too
    assert folder.delete("v")
    assert folder.save("v", xvector_voice())["mode"] == "xvector"  # deleted first, the name is free


def test_a_name_is_reserved_while_its_voice_is_made(tmp_path):
    """Of two uploads of one name, the second is refused while the first's voice is still being made, however long
    that takes; the name is free again once the first is saved (then the file holds it) or has failed."""
    folder = VoiceFolder(tmp_path)
    with folder.reserve("v"):
        with pytest.raises(FileExistsError):
            with folder.reserve("v"):
                pass
        with folder.reserve("w"):  # other names are free
            pass
        folder.save("v", icl_voice("first"))
    with pytest.raises(FileExistsError):  # saved: the file holds the name
        with folder.reserve("v"):
            pass
    with pytest.raises(RuntimeError, match="the voice failed"):
        with folder.reserve("x"):
            raise RuntimeError("the voice failed")  # as a clip the engine refuses
    with folder.reserve("x"):  # released by the failure
        folder.save("x", xvector_voice())
    assert [r["name"] for r in folder.records()] == ["v", "x"] and text_of(folder.load("v")) == "first"
    with pytest.raises(ValueError, match="is not a voice name"):
        with folder.reserve("../x"):
            pass


def test_names_are_the_files_names_unread(tmp_path, monkeypatch):
    folder = VoiceFolder(tmp_path)
    for name in ("b", "a", "C"):
        folder.save(name, xvector_voice())
    (tmp_path / "junk.safetensors").write_bytes(b"not a voice")  # named like one: listed, as load would try it
    (tmp_path / "bad name.safetensors").write_bytes(b"")  # a name the API cannot ask for
    (tmp_path / "notes.txt").write_text("")
    monkeypatch.setattr("morph.serve.voices._record", None)  # no file is opened
    assert folder.names() == ["C", "a", "b", "junk"]


def test_delete_and_unknown_names(tmp_path):
    folder = VoiceFolder(tmp_path)
    folder.save("v", icl_voice())
    folder.load("v")
    assert folder.delete("v") is True and folder.delete("v") is False
    assert folder.records() == [] and not (tmp_path / "v.safetensors").exists()
    with pytest.raises(KeyError) as e:
        folder.load("v")  # not served from the cache once deleted
    assert e.value.args == ("v",)
    with pytest.raises(KeyError):
        folder.load("V")  # names are case-sensitive
    folder.save("V", icl_voice())
    with pytest.raises(KeyError):
        folder.load("v")


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", "", "x" * 65, ".hidden", "x..y", "..", "-x", "_x",
                                  "a b", "abc\n", "é", None, 3])
def test_bad_names_are_refused(tmp_path, name):
    folder = VoiceFolder(tmp_path / "voices")
    for call in (check_name, VoiceFolder.check_name, folder.path_of, folder.load, folder.delete,
                 lambda n: folder.save(n, icl_voice()), lambda n: folder.reserve(n).__enter__()):
        with pytest.raises(ValueError, match=r"name: .* is not a voice name; use 1-64 letters, digits"):
            call(name)
    assert list(tmp_path.rglob("*")) == [tmp_path / "voices"]  # nothing written, inside or outside


@pytest.mark.parametrize("name", ["a", "x" * 64, "Alice_2", "v1.0-final", "9", "x.safetensors"])
def test_good_names(tmp_path, name):
    assert check_name(name) == name
    folder = VoiceFolder(tmp_path)
    assert folder.path_of(name) == tmp_path.absolute() / f"{name}.safetensors"
    folder.save(name, icl_voice())
    assert [r["name"] for r in folder.records()] == [name]


def test_records_skip_non_voice_files_warning_once(tmp_path, caplog):
    folder = VoiceFolder(tmp_path)
    folder.save("good", icl_voice())
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "weights.safetensors"), metadata={"format": "pt"})
    (tmp_path / "bad name.safetensors").write_bytes(icl_voice())  # a voice the API could never ask for
    (tmp_path / "dir.safetensors").mkdir()
    (tmp_path / "notes.txt").write_text("not even safetensors")
    with caplog.at_level(logging.WARNING, logger="morph.serve.voices"):
        assert [r["name"] for r in folder.records()] == ["good"]
        assert [r["name"] for r in folder.records()] == ["good"]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4
    assert all(any(f in m for m in warned) for f in ("junk.", "weights.", "bad name.", "dir."))
    with pytest.raises(ValueError, match="voice 'junk': junk.safetensors is not a valid safetensors voice file"):
        folder.load("junk")
    with pytest.raises(ValueError, match="not a Qwen3-TTS voice"):
        folder.load("weights")
    with pytest.raises(KeyError):
        folder.load("dir")  # a folder is no voice file


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    folder = VoiceFolder(tmp_path)
    first = icl_voice("first")
    folder.save("v", first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.safetensors"]

    def crash(temp, path):  # the whole temporary file is written, then the link fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("morph.serve.voices.os.link", crash)
    with pytest.raises(RuntimeError) as e:
        folder.save("w", icl_voice("second"))
    assert str(e.value) == (f"voice 'w': could not write {tmp_path / 'w.safetensors'}: No space left on device; check "
                            "the voice folder's permissions and free space (cli.py serve --voices)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.safetensors"]
    assert VoiceFolder(tmp_path).load("v") == first


def test_a_saved_voice_is_whole_in_its_file_when_it_is_synced(tmp_path, monkeypatch):
    """fsync reaches only what Python's buffer has handed to the file: a small voice must be flushed first."""
    synced, fsync = [], os.fsync
    monkeypatch.setattr("morph.serve.voices.os.fsync", lambda fd: (synced.append(os.fstat(fd).st_size), fsync(fd)))
    voice = xvector_voice()
    VoiceFolder(tmp_path).save("small", voice)
    assert synced == [len(voice)]


def test_the_cache_reads_an_unchanged_file_once_and_a_replaced_one_again(tmp_path, monkeypatch):
    folder = VoiceFolder(tmp_path)
    folder.save("v", icl_voice("first"))
    reads = []
    real = voice_file.check_voice

    def counting(voice, who, name):
        reads.append(who)
        return real(voice, who, name)

    monkeypatch.setattr("morph.serve.voices.check_voice", counting)
    assert folder.load("v") is folder.load("v") and reads == ["voice 'v'"]
    # replaced from outside the server with a file of the same size, its mtime put back: still re-read
    stat = os.stat(tmp_path / "v.safetensors")
    other = tmp_path / "other.tmp"
    other.write_bytes(icl_voice("firsT"))
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, tmp_path / "v.safetensors")
    assert text_of(folder.load("v")) == "firsT" and len(reads) == 2
    folder.delete("v")
    folder.save("v", icl_voice("third"))
    assert text_of(folder.load("v")) == "third" and len(reads) == 3


def test_concurrent_saves_and_loads(tmp_path):
    """Four threads save, load and delete their own voices while all of them race to save each of five shared
    names: each shared name is saved once, by one thread, and keeps that thread's voice."""
    folder = VoiceFolder(tmp_path)
    errors, won = [], {}

    def work(i):
        try:
            for j in range(10):
                folder.save(f"v{i}", icl_voice(f"{i}-{j}"))
                assert text_of(folder.load(f"v{i}")) == f"{i}-{j}"
                assert folder.delete(f"v{i}")
                try:
                    folder.save(f"shared{j % 5}", icl_voice(f"{i}"))
                    won.setdefault(f"shared{j % 5}", []).append(str(i))
                except FileExistsError:
                    pass
        except Exception as e:  # reported to the main thread, which fails the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(won) == [f"shared{k}" for k in range(5)] and all(len(w) == 1 for w in won.values())
    assert {name: text_of(folder.load(name)) for name in won} == {name: w[0] for name, w in won.items()}
    assert [r["name"] for r in folder.records()] == sorted(won)
    assert not [p for p in tmp_path.iterdir() if not p.name.endswith(".safetensors")]


def test_the_cache_keeps_the_most_recent_voices(tmp_path, monkeypatch):
    monkeypatch.setattr("morph.serve.voices.CACHE_SIZE", 2)
    folder = VoiceFolder(tmp_path)
    for name in ("a", "b", "c"):
        folder.save(name, icl_voice(name))
    folder.load("a")
    folder.load("b")
    assert list(folder._cache) == ["a", "b"]  # at the bound: all kept
    folder.load("a")  # used again: the most recent
    folder.load("c")
    assert list(folder._cache) == ["a", "c"]  # the least recently used went
    assert folder.delete("c") and list(folder._cache) == ["a"]
    with pytest.raises(KeyError) as e:
        folder.load("c")
    assert e.value.args == ("c",)
