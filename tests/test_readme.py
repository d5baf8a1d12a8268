"""The README's map from the paper to iif.py, and its commands, stay true."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_every_line_link_points_at_what_it_names():
    for script in ("iif.py", "rlhf_iif.py", "grpo_iif.py"):
        lines = read(script).splitlines()
        links = re.findall(r"\[`([^`]+)`\]\(" + re.escape(script) + r"#L(\d+)\)", read("README.md"))
        assert len(links) >= 8, script
        for name, line in links:
            assert name in lines[int(line) - 1], f"README links `{name}` to {script} line {line}: {lines[int(line) - 1]!r}"


def test_ci_runs_the_readme_commands():
    readme, ci = read("README.md"), read(".ci/run")
    assert "pip install -r requirements.txt" in readme and "pip install -q -r requirements.txt" in ci
    assert "python -m pytest tests -q" in readme and "python -m pytest tests -q" in ci
