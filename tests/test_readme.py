"""The README and docs/ map the paper onto the scripts' lines, their links resolve, their commands run as
written, and the README's commands stay the ones CI runs."""
import contextlib
import glob
import io
import os
import re
import shlex
import subprocess
import sys
from unittest import mock

import pytest
import tyro

import iif
import iif_variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def names_on(line, name):
    """Whole-word match, so `Stage I` does not match a line that says only "Stage II"."""
    return re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", line) is not None


def test_every_line_link_points_at_what_it_names():
    for script in ("iif.py", "rlhf_iif.py", "research/grpo_iif.py", "research/grpo_variants.py", "research/rlhf_variants.py"):
        lines = read(script).splitlines()
        links = []
        for page in PAGES:  # README.md links `script#LN`, docs/*.md link `../script#LN`
            prefix = "" if page == "README.md" else "../"
            found = re.findall(r"\[`([^`]+)`\]\(" + re.escape(prefix + script) + r"#L(\d+)\)", read(page))
            links += [(page, name, int(line)) for name, line in found]
        assert len(links) >= (4 if script.endswith("_variants.py") else 8), script
        for page, name, line in links:
            assert 1 <= line <= len(lines), f"{page} links `{name}` to {script} line {line}, past its end"
            assert names_on(lines[line - 1], name), f"{page} links `{name}` to {script} line {line}: {lines[line - 1]!r}"


def test_stated_line_counts_are_the_files():
    """"`iif.py` (571 lines)" and the like, on every page, are the file's length today"""
    stated = [(page, script, int(n.replace(",", ""))) for page in PAGES
              for script, n in re.findall(r"`([\w/]+\.py)`\s+\(([\d,]+) lines", read(page))]
    assert len(stated) >= 2
    for page, script, n in stated:
        assert len(read(script).splitlines()) == n, f"{page} says {script} has {n} lines"


def test_stage_banners_match_whole_words():
    assert names_on("        # Stage I (Alg. 1): collect", "Stage I")
    assert not names_on("        # Stage II (Alg. 1): score", "Stage I")
    assert not names_on("        # Stage III (Alg. 1): update", "Stage II")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped but `-` and `_`, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_slugs_are_githubs():
    assert slug("Reading grpo_iif.py next to the paper") == "reading-grpo_iifpy-next-to-the-paper"
    assert slug("TensorBoard, wandb, videos and saved models") == "tensorboard-wandb-videos-and-saved-models"
    assert slug("Fig. 6(b), ours against the paper") == "fig-6b-ours-against-the-paper"
    assert slug("`iif.py` at p = 0.5 — β 1.6") == "iifpy-at-p--05--β-16"


def anchors(page):
    text = re.sub(r"```.*?```", "", read(page), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_relative_links_and_images_resolve():
    checked = 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", read(page), flags=re.S)  # commands, not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
            assert os.path.exists(resolved), f"{page} links {target!r}: {os.path.relpath(resolved, ROOT)} does not exist"
            if anchor and resolved.endswith(".md"):
                assert anchor in anchors(os.path.relpath(resolved, ROOT)), f"{page} links {target!r}: no such heading"
            checked += 1
    assert checked >= 30


def test_docs_pages_link_back_to_the_readme():
    for page in PAGES[1:]:
        assert "](../README.md)" in read(page), page
    readme = read("README.md")
    for page in PAGES[1:]:
        assert "](" + page + ")" in readme, f"README does not link {page}"


def test_ci_runs_the_readme_commands():
    readme, ci = read("README.md"), read(".ci/run")
    assert "pip install -r requirements.txt" in readme and "pip install -q -r requirements.txt" in ci
    assert "python -m pytest tests -q" in readme and "python -m pytest tests -q" in ci


def commands(page):
    """The `python ...` commands of a page: lines of its code blocks, and inline code spans (which may wrap)."""
    text = read(page)
    found = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("python ") and not line.startswith("python -m"):
                found.append(line.split("  #")[0].strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [" ".join(c.split()) for c in re.findall(r"`(python [^`]+)`", prose)]
    return found


DOC_COMMANDS = [(page, c) for page in ("README.md", "docs/usage.md") for c in commands(page)]


def test_the_pages_have_commands():
    assert len(DOC_COMMANDS) >= 8 and any("analysis.py" in c for _, c in DOC_COMMANDS)


@pytest.mark.parametrize("page, command", DOC_COMMANDS)
def test_every_command_runs_as_written(page, command, tmp_path):
    """iif.py and iif_variants.py: the flags are parsed and resolved as the script does before training (the env
    is made); analysis.py: run as written on the committed runs; any other script (a benchmark, written without
    flags): it starts and prints its --help."""
    argv = shlex.split(command)[1:]
    script, flags = argv[0], argv[1:]
    if script in ("iif.py", "research/iif_variants.py"):
        module = iif if script == "iif.py" else iif_variants
        if flags == ["--help"]:  # the help names the flags of Alg. 1
            text = io.StringIO()
            with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(text):
                tyro.cli(module.Args, args=["--help"])
            assert e.value.code == 0
            assert all(f in text.getvalue() for f in ("--env-id", "--filter-method", "--filter-p", "--learning-rate"))
            return
        if "--eval-model" in flags:  # a model saved as the page saves it, where the page reads it
            i = flags.index("--eval-model") + 1
            run_dir = os.path.dirname(flags[i])
            iif.main(iif.resolve_args(iif.Args(env_id="CartPole-v1", total_timesteps=64, num_steps=64,
                                               minibatch_size=32, eval_episodes=1, save_model=True,
                                               runs_dir=str(tmp_path / os.path.dirname(run_dir)),
                                               run_name=os.path.basename(run_dir))))
            flags[i] = str(tmp_path / flags[i])
        args = module.resolve_args(tyro.cli(module.Args, args=[*flags, "--runs-dir", str(tmp_path)]))
        assert args.num_rounds >= 1
        return
    if script == "analysis.py":
        import analysis
        out = tmp_path / "out.png"
        text = io.StringIO()
        with mock.patch.object(sys, "argv", [script, *flags, *(["--out", str(out)] if "curves" in flags else [])]), \
                contextlib.redirect_stdout(text):
            analysis.main()  # in this process: a failure exits with the message
        assert "| " in text.getvalue() or out.stat().st_size > 10_000  # a table, or a figure
        return
    proc = subprocess.run([sys.executable, script, *flags, "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0 and "usage:" in proc.stdout, f"{page}: {command}\n{proc.stderr[-2000:]}"


def cells(text):
    """The page's 'mean [low, high]' figures, in a printout's notation (ASCII minus)"""
    text = " ".join(text.split())  # a figure may wrap
    return {c.replace("−", "-") for c in re.findall(r"[−-]?\d+\.\d+ \[[−-]?\d+\.\d+, [−-]?\d+\.\d+\]", text)}


def printouts():
    """Every figure of the committed printouts under results/"""
    found = set()
    for path in glob.glob(os.path.join(ROOT, "results", "**", "*.md"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "results", "**", "*.txt"), recursive=True):
        with open(path, errors="replace") as f:
            found |= cells(f.read())
    return found


def test_figures_that_name_their_printout_agree_with_it():
    readme, results = read("README.md"), read("docs/results.md")
    line = re.search(r"```\n(round 0 \[1/50\] .*)\n```", readme).group(1)  # the printed line, from its printout
    assert line in read("results/figures/readme_run.txt").splitlines()
    section = results[results.index("## Fig. 6(b), ours against the paper"):]
    table = [row for row in section[:section.index("\n## ")].splitlines() if row.startswith("| ") and "ours" in row]
    fig6b = cells(read("results/figures/paper_fig6b.md") + read("results/figures/paper_fig6b_protocol.md"))
    assert len(table) == 5 and all(c in fig6b for row in table for c in cells(row)), table
    claims = cells(readme[readme.index("## What holds"):])
    assert claims and claims <= printouts(), claims - printouts()


def test_the_readme_stays_under_1200_words():
    """Outside its code blocks"""
    words = len(re.sub(r"```.*?```", "", read("README.md"), flags=re.S).split())
    assert 800 < words <= 1200, words
