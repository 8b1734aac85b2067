"""tools/comfy_gpu_run.py's pieces (tools/comfy_gpu/) that need no ComfyUI or GPU: the wheel manifest, per-node
times from the websocket messages, the prompt edits, a prompt ComfyUI rejects, and the VRAM verdict. The run
itself is checked by running it (`--cpu --size tiny` here, on the GPU device machine for real)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.comfy_gpu import report, runs, server, wheels

ROOT = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


VERSIONS = ("0.8.0", "0.33.0")


def manifest(version="0.8.0"):
    return wheels.manifest_for(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_manifest_pins_one_version_of_each_wheel(version):
    sections = manifest(version)
    assert set(sections) == {"server", "pack", "tools", "ray", "peers", "serve"}
    specs = [s for entries in sections.values() for s in entries]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.]+", s) for s in specs), specs
    # what one fetch installs together (the default sections; each optional one into a folder of its own) names
    # each package once: two wheels of one package stop the offline install, and the fetch counts one per line
    installs = [[s for name in sections if name not in wheels.OPTIONAL for s in sections[name]],
                *(sections[name] for name in wheels.OPTIONAL)]
    for install in installs:
        names = [norm(s.split("==")[0]) for s in install]
        assert len(names) == len(set(names)), "two versions of one package stop the offline install"
    # and a package two installs share ([server] and [serve]: pydantic and its needs) has one version everywhere
    versions = {}
    for s in specs:
        versions.setdefault(norm(s.split("==")[0]), set()).add(s.split("==")[1])
    assert {name: v for name, v in versions.items() if len(v) > 1} == {}
    assert "qwen-tts==0.1.1" in sections["pack"]


def test_each_version_has_its_own_server_wheels_and_shares_the_rest():
    old, new = manifest("0.8.0"), manifest("0.33.0")
    assert {k: v for k, v in old.items() if k != "server"} == {k: v for k, v in new.items() if k != "server"}
    added = {s.split("==")[0] for s in new["server"]} - {s.split("==")[0] for s in old["server"]}
    assert added == {"comfy-aimdo", "comfy-kitchen", "simpleeval", "blake3"}
    # 0.33.0's requirements.txt pins these two: a user's install gets exactly them
    assert {"comfy-kitchen==0.2.31", "comfy-aimdo==0.4.13"} <= set(new["server"])


def test_the_version_comes_from_the_checkout_and_an_unknown_one_is_refused(tmp_path):
    (tmp_path / "comfyui_version.py").write_text('# generated\n__version__ = "0.33.0"\n')
    assert wheels.comfyui_version(tmp_path) == "0.33.0"
    with pytest.raises(FileNotFoundError, match="0.8.0, 0.33.0|0.33.0, 0.8.0"):
        wheels.manifest_for("0.9.1")
    printed = subprocess.run([sys.executable, str(ROOT / "tools" / "comfy_gpu" / "wheels.py"), "specs", "0.33.0",
                              "server"], capture_output=True, text=True, check=True).stdout.split()
    assert printed == manifest("0.33.0")["server"]


def test_manifest_brings_every_requirement_the_device_lacks():
    device = {norm(line.split("==")[0]) for line in (ROOT / "tests" / "fixtures" / "device_packages.txt").read_text()
              .splitlines() if line and not line.startswith("#")}
    carried = {norm(s.split("==")[0]) for s in manifest()["pack"]}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name = norm(re.split(r"[<>=!~ ;\[]", line)[0])
            assert name in device or name in carried, f"{name}: neither on the device nor in [pack]"
    assert not carried & device, "carried wheels would replace the device's own packages"


def test_node_times_come_from_consecutive_executing_messages():
    comfy = server.Server("http://127.0.0.1:1")
    msg = lambda t, node: (t, {"type": "executing", "data": {"node": node, "prompt_id": "p"}})  # noqa: E731
    comfy.messages = [
        (0.5, {"type": "execution_cached", "data": {"nodes": ["1"], "prompt_id": "p"}}),
        msg(1.0, "2"), (1.5, {"type": "progress", "data": {"node": "2", "prompt_id": "p"}}),
        msg(3.0, "3"), msg(3.25, None),
        (4.0, {"type": "executing", "data": {"node": "9", "prompt_id": "other"}}),  # another prompt's: ignored
    ]
    prompt = {"2": {"class_type": "Gen"}, "3": {"class_type": "Save"}}
    times = comfy.node_times("p", prompt, 0, 3.25)
    assert times == {"node_times": [{"node": "2", "class_type": "Gen", "s": 2.0},
                                    {"node": "3", "class_type": "Save", "s": 0.25}], "cached": ["1"]}


def test_prompt_edits():
    info = {"Gen": {"input": {"required": {"text": ["STRING", {"default": "hi"}], "model": ["MODEL"]}}}}
    prompt = {"1": {"class_type": "Gen", "inputs": {"max_new_tokens": 0}}}
    runs.with_defaults(prompt, info)
    assert prompt["1"]["inputs"] == {"max_new_tokens": 0, "text": "hi"}
    assert runs.capped(prompt, 30)["1"]["inputs"]["max_new_tokens"] == 30
    assert runs.script_of(["A", "B"], 3).splitlines()[2].startswith("A: ")


def test_vram_verdict_is_64_mib_above_the_baseline():
    ok = report.vram_check({"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 564}})
    bad = report.vram_check({"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 565}})
    assert ok["pass"] is True and bad["pass"] is False
    assert report.vram_check({"baseline": {}})["pass"] is None  # on CPU there is nothing to judge


def test_the_second_cycle_is_judged_from_where_it_started():
    v = {"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 1000},
         "after_free_memory": {"process_mib": 900}, "second_cycle": {"after_unload_models": {"process_mib": 964}}}
    check = report.vram_check(v)
    assert check["pass"] is False and check["second_cycle.process_mib_above_its_start"] == 64
    assert check["second_cycle.pass"] is True
    v["second_cycle"]["after_unload_models"]["process_mib"] = 965
    assert report.vram_check(v)["second_cycle.pass"] is False


MESSAGES_EVENT = "qwen3tts-morph.messages"


def test_the_text_a_node_shows_is_the_packs_last_messages_event():
    root = Path(__file__).resolve().parents[2]
    sent = re.search(r'MESSAGES_EVENT = "([^"]+)"', (root / "nodes" / "services.py").read_text()).group(1)
    drawn = re.search(r'const EVENT = "([^"]+)"', (root / "nodes" / "web" / "messages.js").read_text()).group(1)
    assert server.MESSAGES_EVENT == sent == drawn == MESSAGES_EVENT
    comfy = server.Server("http://127.0.0.1:1")
    comfy.messages = [(0.0, {"type": MESSAGES_EVENT, "data": {"node": "3", "text": "old"}}),
                      (1.0, {"type": MESSAGES_EVENT, "data": {"node": "12", "text": "morph: preparing …"}}),
                      (1.5, {"type": "progress", "data": {"node": "12", "value": 1, "max": 2}}),
                      (2.0, {"type": MESSAGES_EVENT, "data": {"node": "12", "text": "ready"}})]
    assert comfy.node_texts(1) == {"12": "ready"}


# ComfyUI's answer to POST /prompt when a value is over a node's max (execution.validate_inputs, server.post_prompt)
OVER_MAX = {"http_error": 400, "body": {
    "error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
              "details": "Value 128 bigger than max of 64: batch_size", "extra_info": {}},
    "node_errors": {"5": {"errors": [{"type": "value_bigger_than_max", "message": "Value 128 bigger than max of 64",
                                      "details": "batch_size", "extra_info": {"input_name": "batch_size"}}],
                          "dependent_outputs": ["5"], "class_type": "Qwen3TTSMorphRenderLines"}}}}


def test_a_rejected_prompt_is_reported_with_comfyuis_reasons():
    assert server.rejected({"prompt_id": "p", "number": 0, "node_errors": {}}) is None
    refused = server.rejected(OVER_MAX)
    assert refused["status"] == "rejected" and refused["answer"] == OVER_MAX
    assert refused["error"].splitlines() == [
        "Prompt outputs failed validation: Value 128 bigger than max of 64: batch_size",
        "node 5 (Qwen3TTSMorphRenderLines): Value 128 bigger than max of 64: batch_size"]
    no_prompt = server.rejected({"http_error": 400, "body": {"error": "no prompt", "node_errors": []}})
    assert no_prompt["error"] == "no prompt"


def test_the_run_goes_on_past_a_rejected_prompt(capsys):
    """A rejection once stopped the run with KeyError: 'wall_s'; now it is a result like any other."""
    comfy = server.Server("http://127.0.0.1:1")
    posted = []
    comfy.post = lambda path, body, timeout=30: posted.append(body) or OVER_MAX
    args = SimpleNamespace(prompt_timeout=60, deadline_at=time.time() + 60, max_new_tokens=None, lines=128,
                           batch_sizes=[16, 128])
    prompt = {"5": {"class_type": "Qwen3TTSMorphRenderLines", "inputs": {}},
              "6": {"class_type": "Qwen3TTSMorphVoiceBank", "inputs": {"name": "A"}}}
    wt = SimpleNamespace(ui_to_api=lambda wf, info: prompt)
    ui = {"dialogue": {"nodes": [{"type": "Qwen3TTSMorphRenderLines"}]}}
    result = {"steps": {}}
    runs.run_workflows(comfy, ui, {}, wt, args, result, save=lambda: None)
    posted.clear()
    result["render_lines"] = runs.render_lines(comfy, ui, {}, wt, args)
    assert len(posted) == 2 and all("batching" not in body["prompt"]["5"]["inputs"] for body in posted)  # retired
    info = {"Qwen3TTSMorphRenderLines": {"input": {"required": {"batch_size": ["INT", {"default": 16, "max": 64}]}}}}
    result["over_max"] = runs.over_max(comfy, ui, info, wt, args)
    for r in (result["workflows"]["dialogue"], *result["render_lines"], result["over_max"]):
        assert r["status"] == "rejected" and "bigger than max of 64" in r["error"] and r["wall_s"] >= 0
    assert [r["batch_size"] for r in result["render_lines"]] == [16, 128]
    assert result["over_max"]["batch_size"] == 65 and result["over_max"]["expected"] == "rejected"
    report.print_summary(result)
    out = capsys.readouterr().out
    assert "dialogue                 rejected" in out
    assert "render lines x128 batch 128: rejected" in out
    assert "batch_size 65 (over max): rejected  ['node 5 (Qwen3TTSMorphRenderLines): Value 128" in out


def test_the_run_passes_only_when_comfyui_refused_the_batch_over_the_max():
    done = {"workflows": {"a": {"status": "success"}}, "interrupt": {"status": "execution_interrupted"},
            "render_lines": [{"status": "success"}, {"status": "skipped"}], "repeated": {"all_success": True},
            "over_max": {"status": "rejected"}}
    assert report.passed(done)
    assert not report.passed({**done, "over_max": {"status": "success"}})
    assert not report.passed({**done, "render_lines": [{"status": "success"}, {"status": "error"}]})


def test_the_entry_point_finds_its_parts_from_any_folder(tmp_path):
    # tools/comfy_gpu_run.sh runs it as a script: its parts must import without the repository on sys.path
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "comfy_gpu_run.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    assert "--batch-sizes" in done.stdout and "--comfyui-version" in done.stdout


def test_the_reserve_leaves_room_for_the_larger_model_and_its_run_not_for_both():
    from tools.comfy_gpu import eviction

    total, ours, second = 80 * 2 ** 30, int(2.2 * 2 ** 30), int(4.1 * 2 ** 30)
    budget = total / 2 ** 30 - eviction.reserve_gib(total, [ours, second])  # what ComfyUI may use, GiB
    need = lambda size: 1.1 * size / 2 ** 30 + 0.8  # noqa: E731 (model_management.load_models_gpu's rule)
    assert need(second) < budget < need(second) + ours / 2 ** 30


def test_the_second_graph_sits_beside_ours_with_its_links_renamed():
    from tools.comfy_gpu import eviction

    graph = {"1": {"class_type": "Load", "inputs": {"model": "x"}}, "2": {"class_type": "Gen", "inputs": {
        "model": ["1", 0], "text": "hi", "pair": [3, 4]}}}
    moved = eviction.prefixed(graph, "second_")
    assert set(moved) == {"second_1", "second_2"}
    assert moved["second_2"]["inputs"] == {"model": ["second_1", 0], "text": "hi", "pair": [3, 4]}
    assert graph["2"]["inputs"]["model"] == ["1", 0]


def test_only_comfyuis_model_management_lines_since_the_mark_are_kept(tmp_path):
    from tools.comfy_gpu import eviction

    log = tmp_path / "server.log"
    log.write_text("Requested to load TTSWeights\nprompt executed\n")
    lines, mark = eviction.memory_lines(log, 0)
    log.write_text(log.read_text() + "loaded completely 4100 MB\n2 models unloaded.\nPrompt executed in 1 s\n")
    assert lines == ["Requested to load TTSWeights"]
    assert eviction.memory_lines(log, mark)[0] == ["loaded completely 4100 MB", "2 models unloaded."]


def test_the_run_fails_when_our_model_comes_back_with_another_take():
    ok = dict(workflows={}, render_lines=[], over_max={"status": "rejected"}, interrupt={"status": "skipped"},
              repeated={"all_success": True})
    assert report.passed({**ok, "eviction": {"status": "skipped"}})
    assert not report.passed({**ok, "eviction": {"ok": False, "variants": {}}})


def test_a_partial_or_whole_unload_is_an_eviction_and_a_complete_load_brings_ours_back():
    from tools.comfy_gpu import eviction

    # the lines ComfyUI 0.33.0 wrote on an H100 (bench/results/h100-2026-11-23b/comfyui-0.33-gpu)
    second = ["Requested to load TTSWeights", "Unloaded partially: 1095.60 MB freed, 1128.29 MB remains loaded, "
              "18.00 MB buffer reserved, lowvram patches: 0", "loaded completely;  4102.99 MB loaded, full load: True"]
    again = ["Unloaded partially: 1372.46 MB freed, 2762.65 MB remains loaded, 24.01 MB buffer reserved, lowvram "
             "patches: 0", "loaded completely;  2191.76 MB loaded, full load: True"]
    both = [2332038554, 4336096802]  # the two checkpoints' bytes: 6,359 MiB
    assert eviction.judged(second, again, 6000.0, both) == {"evicted": True, "loaded_back": True}
    assert eviction.judged(second[:1] + second[2:], again[1:], 6400.0, both) == {"evicted": False,
                                                                                 "loaded_back": True}
    assert eviction.judged(["0 models unloaded."], [], None, both)["evicted"] is False
    # a whole unload logs nothing at ComfyUI's default level: less in use than both models' weights says it
    # (ComfyUI 0.33.0 on an H200, bench/results/h200-2026-11-30c: 4,791 MiB in use with the second model's run)
    assert eviction.judged(second[:1] + second[2:], [], 4791.1, both)["evicted"] is True


def test_a_file_changed_after_staging_is_named_against_the_staged_commit(tmp_path):
    """The staged record (`git ls-files -s` at staging) against the copy a later call carries: a file committed
    or edited since is named, an unchanged tree names none."""
    from tools.comfy_gpu.install import changed_since_staging

    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "morph").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "morph" / name).write_text(f"# {name}\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "staged"], check=True)
    listing = tmp_path / "project_files.txt"
    listing.write_text(subprocess.run([*git, "ls-files", "-s", "--", "morph"], check=True, capture_output=True,
                                      text=True).stdout)
    assert changed_since_staging(listing, tmp_path) == []
    (tmp_path / "morph" / "b.py").write_text("# b.py, committed after staging\n")
    assert changed_since_staging(listing, tmp_path) == ["morph/b.py"]


def test_a_batch_size_given_twice_is_rendered_twice_not_read_from_comfyuis_cache():
    wt = SimpleNamespace(ui_to_api=lambda wf, info: {"5": {"class_type": "Qwen3TTSMorphRenderLines", "inputs": {}},
                                                     "6": {"class_type": "Qwen3TTSMorphVoiceBank",
                                                           "inputs": {"name": "A"}}})
    ui = {"dialogue": {"nodes": [{"type": "Qwen3TTSMorphRenderLines"}]}}
    first, again = (runs.lines_prompt(ui, {}, wt, 4, 64, job)["5"]["inputs"] for job in (0, 1))
    assert first["batch_size"] == again["batch_size"] == 64
    assert first["seed"] != again["seed"] and first["filename_prefix"] != again["filename_prefix"]


def test_unload_is_read_once_torchs_active_memory_has_settled_too(monkeypatch):
    # under cudaMallocAsync the reserve and the process stay put while ComfyUI is still moving models off
    readings = iter([{"process_mib": 9, "torch_reserved_mib": 8, "torch_active_mib": a} for a in (5, 3, 1, 1)])
    monkeypatch.setattr(server, "vram", lambda comfy, pid, cpu: next(readings))
    monkeypatch.setattr(server.time, "sleep", lambda seconds: None)
    assert server.settle_vram(None, 1, False)["torch_active_mib"] == 1
