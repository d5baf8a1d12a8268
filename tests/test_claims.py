"""results/claims.py: its printout is what the committed runs give, and the README's verdicts and docs/results.md's
verdict tables are that printout's, cell by cell: a changed run fails here until the docs follow."""
import contextlib
import io
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "results"))
import claims  # noqa: E402

REDO = "python results/claims.py > results/claims.md && python results/claims.py --docs"


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_the_printout_is_what_the_committed_runs_give():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        claims.main()
    new, old = out.getvalue().splitlines(), read("results/claims.md").splitlines()
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    assert not changed and len(new) == len(old), f"results/claims.md is not the runs' ({REDO}): {changed[:3]}"


def test_docs_results_tables_are_the_printouts_cell_by_cell():
    printed, page = claims.tables(read("results/claims.md")), read("docs/results.md")
    lines, marks = page.splitlines(), claims.marked(page)
    assert set(marks) == set(printed) - {"README"}, "every verdict table of the printout, once in docs/results.md"
    for mark, (i, j) in marks.items():
        doc = [[c.strip() for c in row.strip("|").split("|")] for row in lines[i:j]]
        want = [[c.strip() for c in row.strip("|").split("|")] for row in printed[mark]]
        assert len(doc) == len(want), f"{mark}: {len(doc)} rows, the printout {len(want)} ({REDO})"
        for d, w in zip(doc, want):
            assert d == w, f"{mark}, {w[0]}: docs/results.md has {d}, the printout {w} ({REDO})"


def test_the_readmes_verdicts_are_the_printouts_lines():
    printed, readme = claims.tables(read("results/claims.md")), read("README.md")
    i, j = claims.marked(readme)["README"]
    doc = " ".join(" ".join(readme.splitlines()[i:j]).split())
    assert doc == " ".join(" ".join(printed["README"]).split()), f"README.md's verdicts are not the printout's ({REDO})"
    assert "## What holds" in readme[:readme.index("<!-- claims.md: README -->")]


def test_marks_are_found_and_a_changed_cell_is_caught():
    page = "text\n<!-- claims.md: T -->\n| a | b |\n|---|---|\n| x | 1 [0, 2] |\n\nmore"
    assert claims.marked(page) == {"T": (2, 5)}
    lines = page.splitlines()
    assert claims.tables("### T\n\n| a | b |\n|---|---|\n| x | 1 [0, 2] |\n")["T"] == lines[2:5]
    assert claims.tables("### T\n\n| a | b |\n|---|---|\n| x | 1 [0, 3] |\n")["T"] != lines[2:5]
