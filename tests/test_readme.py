"""The README stays one a newcomer reads in five minutes, and true: at most 300 lines, no commit hash, every relative
link in it and in docs/ resolves, as does every pointer from the code to a page of docs/ and its section, and every
command in its code blocks is one a test or CI runs. The commands that
need neither network nor GPU run here as written, on the tiny model: the CLI's, the curl and the openai client's."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.morph.conftest import lean  # noqa: F401 (a fixture: the tiny model in the server's mode)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 300
RAN_HERE = "tests/test_readme.py"  # run as written by the tests below

# Every shell command of the README (a pattern it matches whole) and where it runs: a test, or CI (.ci/run runs
# tools/test.sh, which builds .venv-test with tools/setup_env.sh, whose last step is install.py).
WHERE_RUN = [
    (r"bash tools/setup_env\.sh", "tools/test.sh"),
    (r"bash tools/setup_env\.sh --cpu", "tests/tools/test_setup_env.py"),  # its calls; PyTorch's index is not reached
    # the user's own steps in their ComfyUI: the registry's install needs the network (its id is checked below)
    (r"comfy node install comfyui-qwen3-tts-morph", None),
    (r"cd ComfyUI/custom_nodes/comfyui-qwen3-tts-morph", None),
    (r"python -m pip install -r requirements\.txt", "tests/test_install.py"),  # resolved against an environment
    (r"python install\.py", "tools/setup_env.sh"),
    (r"python -m pip install \.", "tests/test_install.py"),  # the wheel, installed and its example run
    (r"\.venv/bin/python cli\.py .*", RAN_HERE),
    (r"\.venv/bin/python cli\.py serve", "tests/test_cli_serve.py"),
    (r"\.venv/bin/python -m pip install '\.\[serve\]'", "tests/test_install.py"),
    (r"curl .*", RAN_HERE),
    (r"bash tools/test\.sh", ".ci/run"),
]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, re.M | re.S)


def shell_commands(text: str) -> list[str]:
    """The commands of the shell blocks: continued lines joined, comments dropped, `a && b` as two."""
    commands = []
    for lang, body in code_blocks(text):
        if lang == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                commands += [" ".join(part.split()) for part in line.split("&&") if part.strip()]
    return commands


def where_run(command: str) -> list[str | None]:
    """The places of the first matching pattern: the most specific is listed last, so the last match wins."""
    return [where for pattern, where in WHERE_RUN if re.fullmatch(pattern, command)][-1:]


def test_the_readme_has_at_most_300_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move what only some users need into docs/"


def commit_hashes(text: str) -> list[str]:
    """Any word of 7+ hex digits that mixes digits and letters is taken for a commit hash."""
    words = re.findall(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w/.-])", text)
    return [w for w in words if re.search(r"\d", w) and re.search(r"[a-f]", w)]


def test_a_commit_hash_is_found_in_prose_and_a_results_folder_is_not():
    assert commit_hashes("ran at 20529a5, then (at 8077a4a)") == ["20529a5", "8077a4a"]
    assert commit_hashes("bench/results/h200-2026-11-29c/ and figures-20529a5/; 2026 and deadbeef") == []


FIRST_SCREEN = 40  # lines


def test_the_first_screen_shows_a_picture_an_install_and_a_command_that_makes_sound():
    """What a newcomer sees first: an image, the install by the registry id and the Manager's name that
    pyproject.toml gives, and the CLI's one-liner."""
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    assert re.search(r"!\[[^\]]+\]\([^)\s]+\.(png|jpg|jpeg|gif|webp)\)|<img [^>]*src=", head), \
        f"the README's first {FIRST_SCREEN} lines show no image"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert f"comfy node install {project['project']['name']}" in shell_commands(head)
    assert f"search for **{project['tool']['comfy']['DisplayName']}**" in head
    assert any(re.fullmatch(r"\.venv/bin/python cli\.py --text .+", c) for c in shell_commands(head)), \
        f"the README's first {FIRST_SCREEN} lines hold no command that speaks"


def test_the_readme_names_no_commit():
    """A commit hash is history (git and bench/results/*/NOTES.md keep it)."""
    hashes = commit_hashes(README.read_text(encoding="utf-8"))
    assert not hashes, f"README.md names commits {hashes}: say what the evidence shows, link docs/performance.md"


def test_the_performance_page_names_no_commit():
    """docs/performance.md is what a user gets today, each figure with its device, conditions and results folder;
    which commit ran it is history, kept in that folder's NOTES.md."""
    hashes = commit_hashes((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))
    assert not hashes, (f"docs/performance.md names commits {hashes}: name the bench/results/ folder instead, whose "
                        "NOTES.md keeps the commit")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^ *```.*?^ *```", "", page.read_text(encoding="utf-8"),
                                                flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = urllib.parse.unquote(link).partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or ROOT not in target.parents:
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(link)
    assert not broken, f"{page.name}: links to nothing in the repository: {broken}"
    assert links or page != README  # the README links its docs: a pattern that found none is broken


def test_every_pointer_from_the_code_names_a_page_and_section_of_docs():
    """A docstring or comment says "(docs/PAGE.md, Section)" where the design it would repeat lives: the page and a
    heading that begins the section's words, or that they begin, must exist (a pointer wraps lines as prose does)."""
    code = [*ROOT.glob("*.py"), *(p for d in ("morph", "nodes", "postprocess") for p in (ROOT / d).rglob("*.py"))]
    broken, found = [], 0
    for path in code:
        text = re.sub(r"\n[ \t]*#?[ \t]*", " ", path.read_text(encoding="utf-8"))
        for page, section in re.findall(r"docs/([\w-]+\.md)(?:, ([A-Z][^)\n;:]*))?", text):
            found += 1
            target = ROOT / "docs" / page
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M) if target.exists() else []
            if not target.exists() or section and not any(section.startswith(h) or h.startswith(section) for h in headings):
                broken.append(f"{path.relative_to(ROOT)}: docs/{page}" + (f", {section}" if section else ""))
    assert found, "the pattern found no pointer: it is broken"
    assert not broken, f"pointers to a page or section docs/ does not have: {broken}"

def test_every_readme_command_runs_in_a_test_or_in_ci():
    commands = shell_commands(README.read_text(encoding="utf-8"))
    unknown = [c for c in commands if not where_run(c)]
    assert not unknown, f"README commands no test or CI runs (run them in one, then list them here): {unknown}"
    unused = [p for p, _ in WHERE_RUN if not any(re.fullmatch(p, c) for c in commands)]
    assert not unused, f"listed here but no longer in the README: {unused}"
    for command in commands:
        for where in where_run(command):
            assert where is None or (ROOT / where).is_file(), (command, where)
    python = [body for lang, body in code_blocks(README.read_text(encoding="utf-8")) if lang == "python"]
    # the Python API's example (tests/test_install.py runs it) and the openai client's (run below)
    assert sorted(("MorphTTS.load" in b, "OpenAI(" in b) for b in python) == [(False, True), (True, False)]


@pytest.fixture
def named_model(tiny_dir, tmp_path, monkeypatch):
    """The tiny model where the CLI looks for the README's default model, its --models-dir."""
    models = tmp_path / "models"
    (models / "Qwen3-TTS-12Hz-0.6B-Base").mkdir(parents=True)
    for item in Path(tiny_dir).iterdir():
        (models / "Qwen3-TTS-12Hz-0.6B-Base" / item.name).symlink_to(item)
    monkeypatch.setenv("QWEN3TTS_MODELS_DIR", str(models))


def speech(path: Path, seconds: float = 2.0, rate: int = 24000) -> None:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32), rate)


SHORT = ["--max-new-tokens", "6"]  # random weights speak until their frame limit comes: hundreds of frames on the CPU


def test_the_readmes_cli_commands_run_as_written(named_model, tmp_path, monkeypatch, capsys):
    """Speak a line, save a voice and say what it holds, render a script: in the README's order, in one folder, each
    as written (the line and the script held to a few frames)."""
    import cli

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    speech(work / "me.wav")
    speech(work / "bob.wav", 1.5)
    text = README.read_text(encoding="utf-8")
    script = next(body for lang, body in code_blocks(text) if lang == "text")
    (work / "scene1.txt").write_text(script, encoding="utf-8")
    commands = [c for c in shell_commands(text) if c.startswith(".venv/bin/python cli.py") and " serve" not in c]
    assert len(commands) == 4
    for command in commands:
        argv = shlex.split(command.removeprefix(".venv/bin/python cli.py"))
        argv += SHORT if argv[0] != "voice" else []
        assert cli.main(argv) == 0, (command, capsys.readouterr().err[-3000:])
    assert sf.info("output/out.wav").samplerate == 24000
    assert Path("output/voices/me.safetensors").is_file()
    renders = Path("output/renders")
    assert sorted(p.name for p in renders.glob("scene1_*.wav")) == ["scene1_0001_Alice.wav", "scene1_0002_Bob.wav"]
    assert {"scene1.wav", "scene1.srt", "scene1_lines.json"} <= {p.name for p in renders.iterdir()}
    assert sorted(p.name for p in work.iterdir()) == ["bob.wav", "me.wav", "output", "scene1.txt"]  # nothing else


def test_the_readmes_curl_and_openai_client_speak_through_a_real_server(lean, tmp_path):  # noqa: F811
    from morph.lines.voice import save_voice
    from tests.morph.serve.conftest import serving

    work = tmp_path / "work"
    work.mkdir()
    speech(work / "me.wav")
    wave, rate = sf.read(work / "me.wav")
    save_voice(lean.make_voice(wave, rate, transcript="What me.wav says."), work / "voices" / "me.safetensors")
    text = README.read_text(encoding="utf-8")
    [curl] = [c for c in shell_commands(text) if c.startswith("curl ")]
    client = [body for lang, body in code_blocks(text) if lang == "python" and "OpenAI(" in body][0]
    with serving(lean, work / "voices", api_key=None, max_frames=24) as (url, _):  # each request held to 24 frames
        run = subprocess.run(["bash", "-c", curl.replace("http://127.0.0.1:8000", url)], cwd=work,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        exec_run = subprocess.run([sys.executable, "-c", client.replace("http://127.0.0.1:8000", url)], cwd=work,
                                  capture_output=True, text=True, timeout=300)
        assert exec_run.returncode == 0, exec_run.stderr[-3000:]
    audio, rate = sf.read(work / "hello.wav")
    assert rate == 24000 and audio.size > 0
    pcm = (work / "hello.pcm").read_bytes()
    assert len(pcm) > 0 and len(pcm) % 2 == 0
