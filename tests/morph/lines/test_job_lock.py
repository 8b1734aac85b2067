"""morph/lines/job_lock.py's token: a distributed job's worker puts a line file in place only while its job holds the
folder, so a worker that outlives its killed driver writes nothing into a folder that another job took over."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from morph.lines.job_lock import FolderTakenOver
from morph.lines.store import LineFiles, LineStore

WAV = np.ones(100, np.float32)


def test_a_late_worker_of_a_killed_driver_writes_nothing_into_the_job_that_took_over(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parents[3])!r})
        from morph.lines.store import LineStore
        store = LineStore({str(tmp_path)!r}, "s", "driver", what="the first job").__enter__()
        print(store.lock.token, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)], stdout=subprocess.PIPE, text=True)
    token = driver.stdout.readline().strip()
    assert driver.wait(30) == -signal.SIGKILL and len(token) == 32
    worker = LineFiles(tmp_path, "s", "worker", token=token)  # what the first job's worker was given
    with LineStore(tmp_path, "s", "second", what="the second job") as store:
        assert store.lock.token not in (None, token)
        with pytest.raises(FolderTakenOver, match=rf"^worker: this worker's job no longer holds {tmp_path} \(now the "
                                                  rf"second job, process {os.getpid()} on .+\): s_0001_A.wav is not "
                                                  r"written there; the job was stopped or another job took the folder "
                                                  r"over, which renders the lines itself$"):
            worker.write_line(1, "A", WAV)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".s.lock"]  # no line file, no temporary one
        LineFiles(tmp_path, "s", "worker", token=store.lock.token).write_line(1, "A", WAV)  # its own workers write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s_0001_A.wav"]


def test_a_worker_writes_while_its_job_holds_the_folder_and_not_after_it_ends(tmp_path):
    with LineStore(tmp_path, "s", "driver") as store:
        worker = LineFiles(tmp_path, "s", "worker", token=store.lock.token)
        assert worker.write_line(1, "A", WAV).samples == 100
    with pytest.raises(FolderTakenOver, match=r"no job holds it now"):
        worker.write_line(2, "A", WAV)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s_0001_A.wav"]


def test_each_holding_has_a_token_of_its_own_which_goes_with_it(tmp_path):
    store = LineStore(tmp_path, "s", "test")
    tokens = []
    for _ in range(2):
        with store:
            tokens.append(store.lock.token)
        assert store.lock.token is None
    assert len(set(tokens)) == 2 and None not in tokens


def test_the_lock_file_names_its_holder_and_a_lock_file_of_another_shape_is_no_holder(tmp_path):
    import json
    import re
    import socket

    from morph.lines.job_lock import check_holds

    with LineStore(tmp_path / "a" / "b", "c/s", "test", what="the job") as store:  # folders made as deep as needed
        holder = json.loads(store.lock_path.read_text(encoding="utf-8"))
        assert store.lock_path == tmp_path / "a" / "b" / "c" / ".s.lock"
        assert (holder["pid"], holder["host"], holder["what"], holder["token"]) == (os.getpid(), socket.gethostname(),
                                                                                    "the job", store.lock.token)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", holder["since"])
    lock = tmp_path / ".s.lock"
    lock.write_text("\n[1, 2]", encoding="utf-8")
    with pytest.raises(FolderTakenOver, match=rf"^w: this worker's job no longer holds {tmp_path} \(no job holds it "
                                              r"now\): x.wav is not written"):
        check_holds(lock, "token", "w", tmp_path / "x.wav")
