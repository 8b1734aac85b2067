"""bench/profile_render.py on the tiny model on the CPU: every part of a render charged once, and the render
left as it was."""

from morph import render
from morph.reference import loop as reference

from bench import profile_render


def test_the_parts_of_a_render_add_up_and_nothing_stays_wrapped(tiny_dir, tmp_path):
    before = (render.prompt_inputs, reference.prefill, reference.decode)
    report = profile_render.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32",
                                  "--batch-sizes", "2", "--frames", "6", "--json", str(tmp_path / "p.json")])
    row = report["results"][0]
    parts = row["phases_s"]
    assert set(parts) == {"prompt_inputs", "prefill", "frame_loop", "generate", "generate_outside_loop", "rest"}
    assert all(parts[k] > 0 for k in ("prompt_inputs", "prefill", "frame_loop", "generate"))
    # the loop and the prefill run inside upstream's generate, and generate and the prompt inside the render
    assert parts["generate"] >= parts["prefill"] + parts["frame_loop"] and parts["generate_outside_loop"] >= 0
    assert parts["rest"] >= 0 and parts["generate"] + parts["prompt_inputs"] <= row["synced_render_s"]
    assert (render.prompt_inputs, reference.prefill, reference.decode) == before
