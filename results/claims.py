"""Every verdict of the README's "What holds of the paper's claims", from the committed runs, read one way
(research/verdicts.py): per seed, one difference of two arms; over the seeds, the mean [95 % t-interval] and the
paired t-test's p; one claim is one family, Holm over its environments (the paper's six apart from CartPole and
DoorKey); "ahead" or "behind" only where the Holm-adjusted p is below 0.05.

SE_ave's reading is antisymmetric, (SE(arm over the baseline's levels) - SE(baseline over the arm's levels)) / 2: two
copies of one run score 0 in expectation, where the paper's reading (the arm over the baseline's record levels) leans
below 0. The first table checks both on the null, standard PPO against its own copy reseeded after round 0. Area (the
mean test return over the compared rounds) and final return stand beside it; "the readings part" where one reading's
interval lies on one side of 0 and another's mean on the other. Against the paper, the paper's reading meets the
paper's numbers (Welch's test, Holm over the six).

    python results/claims.py > results/claims.md     # the printout
    python results/claims.py --docs                  # its tables into docs/results.md, its lines into README.md

docs/results.md marks each table it takes with `<!-- claims.md: <the table's heading> -->`, README.md its lines
with `<!-- claims.md: README -->`; tests/test_claims.py checks both against the printout, and the printout against
the committed runs.
"""
import argparse
import glob
import json
import os
import re
import sys
import textwrap

import numpy as np
import scipy.stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "research"))
sys.path.insert(0, os.path.join(ROOT, "results"))
import analysis  # noqa: E402
import verdicts  # noqa: E402
from held_step import ENVS, compare  # noqa: E402

HELD = os.path.join(ROOT, "results", "held-step", "runs")
PAPER_ENVS = list(ENVS)[:6]
OUTSIDE = list(ENVS)[6:]  # CartPole and DoorKey: SB3's generic settings, not the paper's
# Fig. 6(b)'s runs: the paper's test protocol, 5 seeds (results/held_step.py); BipedalWalker's whole budget, tested
# every 2nd round on 100 episodes (results/runs; its held-step runs stop at round 100)
FIG6B = {e: (HELD, "standard", "influence", ENVS[e][1]) for e in ENVS}
FIG6B["BipedalWalker-v3"] = (os.path.join(ROOT, "results", "runs"), "none", "influence", 500)
PAPER_SE_AVE = {"FrozenLake-v1": (33.7, 3.4), "Acrobot-v1": (36.7, 6.5), "MiniGrid-Empty-8x8-v0": (67.5, 5.1),
                "highway-v0": (37.7, 6.1), "LunarLander-v3": (28.2, 1.3), "BipedalWalker-v3": (31.0, 8.7)}  # Fig. 6(b)
SHORT = {"FrozenLake-v1": "FrozenLake", "Acrobot-v1": "Acrobot", "MiniGrid-Empty-8x8-v0": "MiniGrid",
         "highway-v0": "highway", "LunarLander-v3": "LunarLander", "BipedalWalker-v3": "BipedalWalker",
         "CartPole-v1": "CartPole", "MiniGrid-DoorKey-5x5-v0": "DoorKey"}
TUNED = os.path.join(ROOT, "results", "tuned", "runs")
READINGS = (("anti", "SE_ave, antisymmetric %"), ("se_ave", "SE_ave, paper's reading %"), ("area", "area"),
            ("final", "final return"))
_loaded = {}
FAMILIES = {}  # title: (envs, each reading's statistics), as printed


def runs(runs_dir, env_id):
    if (runs_dir, env_id) not in _loaded:
        _loaded[runs_dir, env_id] = analysis.load_runs(runs_dir, env_id)
    return _loaded[runs_dir, env_id]


def contrast(pairs, envs):
    """One claim's family over envs: pairs[env] = (runs dir, baseline arm, arm, rounds). Per env the per-seed
    differences of each reading, and each reading's statistics with Holm over the envs that have 2 seeds or more"""
    per_env = {}
    for e in envs:
        runs_dir, base, other, n = pairs[e]
        found = runs(runs_dir, e)
        c = compare(found.get(base, {}), found.get(other, {}), n)
        if len(c["seeds"]) >= 2:
            per_env[e] = c
    stats = {key: verdicts.family({e: c[key] for e, c in per_env.items()}, ".3g" if key != "anti" else ".1f")
             for key, _ in READINGS}
    return per_env, stats


def parting(stats, e):
    """The readings part where one reading's interval lies on one side of 0 and another reading's mean on the other"""
    sides = {k: 1 if stats[k][e]["lo"] > 0 else -1 if stats[k][e]["hi"] < 0 else 0 for k in ("anti", "area", "final")}
    means = {k: np.sign(stats[k][e]["mean"]) for k in sides}
    return any(s and means[k2] == -s for k, s in sides.items() for k2 in sides if k2 != k)


def print_family(title, pairs, envs, note=""):
    """The family's table; returns (per_env, stats) and keeps the stats for the README's lines"""
    per_env, stats = contrast(pairs, envs)
    FAMILIES[title] = (envs, stats)
    print(f"\n### {title}\n")
    if note:
        print(note + "\n")
    print("| env | seeds | SE_ave, antisymmetric % | p | p, Holm | verdict | SE_ave, paper's reading % | area | "
          "final return | readings |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in envs:
        if e not in per_env:
            print(f"| {e} | {len(compare_seeds(pairs, e))} | - | - | - | no verdict: fewer than 2 seeds | - | - | - | - |")
            continue
        a = stats["anti"][e]
        cells = [f"{stats[k][e]['text']} (p {verdicts.p_text(stats[k][e]['p'])})" for k in ("se_ave", "area", "final")]
        print(f"| {e} | {a['n']} | {a['text']} | {verdicts.p_text(a['p'])} | {verdicts.p_text(a['p_holm'])} | "
              f"{a['verdict']} | {' | '.join(cells)} | {'part' if parting(stats, e) else 'agree'} |")
    return per_env, stats


def compare_seeds(pairs, e):
    runs_dir, base, other, n = pairs[e]
    found = runs(runs_dir, e)
    return compare(found.get(base, {}), found.get(other, {}), n)["seeds"]


def held(base, other, envs=ENVS):
    return {e: (HELD, base, other, ENVS[e][1]) for e in envs}


def null_check():
    print("### The null: standard PPO against its own copy reseeded after round 0\n")
    print("Same theta(0) and B(0), other numbers after: the two arms are exchangeable, so a reading with no lean "
          "gives 0 in expectation. The paper's reading (the copy over standard's record levels) against the "
          "antisymmetric one; results/held_step.py's reseeded arm.\n")
    print("| env | seeds | SE_ave, paper's reading % | p | SE_ave, antisymmetric % | p | holds its null |")
    print("|---|---|---|---|---|---|---|")
    below = []
    for e in ENVS:
        c = compare(runs(HELD, e).get("standard", {}), runs(HELD, e).get("reseeded", {}), ENVS[e][1])
        if len(c["seeds"]) < 2:
            continue
        (m, lo, hi), (am, alo, ahi) = verdicts.t_interval(c["se_ave"]), verdicts.t_interval(c["anti"])
        below.append(m < 0)
        print(f"| {e} | {len(c['seeds'])} | {m:.1f} [{lo:.1f}, {hi:.1f}] | {verdicts.p_text(verdicts.p_value(c['se_ave']))} "
              f"| {am:.1f} [{alo:.1f}, {ahi:.1f}] | {verdicts.p_text(verdicts.p_value(c['anti']))} | "
              f"{'yes' if alo <= 0 <= ahi else 'no'} |")
    sign = scipy.stats.binomtest(sum(below), len(below), 0.5).pvalue
    print(f"\nThe paper's reading is below 0 on {sum(below)} of {len(below)} environments (sign test p = "
          f"{verdicts.p_text(sign)}).")


def against_paper():
    print("\n### Against the paper: our SE_ave (the paper's reading) and the paper's Fig. 6(b)\n")
    print("Welch's two-sided test of our seeds against the paper's mean +- std over its 3 seeds, Holm over the six; "
          "below or above only where the Holm-adjusted p < 0.05. The floor: the reseeded copy's SE_ave in the same "
          "reading (the lean a comparison of two alike arms already has).\n")
    print("| env | seeds | ours % | paper % | p | p, Holm | against the paper | floor % |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for e in PAPER_ENVS:
        c = compare(*[runs(FIG6B[e][0], e).get(arm, {}) for arm in FIG6B[e][1:3]], FIG6B[e][3])
        floor = compare(runs(HELD, e).get("standard", {}), runs(HELD, e).get("reseeded", {}), ENVS[e][1])
        rows.append((e, c["se_ave"], verdicts.welch(c["se_ave"], *PAPER_SE_AVE[e]), floor))
    adjusted = verdicts.holm([p for *_, p, _ in rows])
    words = {}
    for (e, x, p, floor), pa in zip(rows, adjusted):
        mean, lo, hi = verdicts.t_interval(x)
        word = verdicts.verdict(mean - PAPER_SE_AVE[e][0], pa, len(x), "above", "below")
        word = "not detected to differ" if word.startswith("not") else word
        words.setdefault(word, []).append(SHORT[e])
        fm, flo, fhi = verdicts.t_interval(floor["se_ave"])
        ftext = f"{fm:.1f} [{flo:.1f}, {fhi:.1f}] ({len(floor['seeds'])})" if len(floor["seeds"]) > 1 else "-"
        print(f"| {e} | {len(x)} | {mean:.1f} [{lo:.1f}, {hi:.1f}] | {PAPER_SE_AVE[e][0]} +- {PAPER_SE_AVE[e][1]} | "
              f"{verdicts.p_text(p)} | {verdicts.p_text(pa)} | {word} | {ftext} |")
    FAMILIES["paper"] = "; ".join(f"{w} on {listed(n)}" for w, n in words.items())


def one_round_summary():
    import one_round
    print("\n### One round at an equal step: held IIF - held random from the same theta(k) and B(k)\n")
    print("results/one_round.py (its stages: results/held-step/one_round.md): every state of the held-critic runs, "
          "one round each, read on data neither update saw; per seed the mean over its states; Holm over the "
          "environments.\n")
    print("| env | seeds | states | surrogate gain, IIF - random (A_hat's std) | p, Holm | verdict | test return, "
          "IIF - random | p, Holm | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    data = {e: one_round.per_seed(e)["all"] for e in ENVS}
    fams = {k: verdicts.family({e: d[k] for e, d in data.items() if len(d[k])}, ".3g") for k in ("gain", "test")}
    FAMILIES["one round"] = (list(ENVS), fams)
    for e in ENVS:
        if e not in fams["gain"]:
            print(f"| {e} | 0 | 0 | - | - | no state read yet | - | - | - |")
            continue
        g, t = fams["gain"][e], fams["test"][e]
        print(f"| {e} | {g['n']} | {one_round.n_states(e)} | {g['text']} | {verdicts.p_text(g['p_holm'])} | "
              f"{g['verdict']} | {t['text']} | {verdicts.p_text(t['p_holm'])} | {t['verdict']} |")


RLHF = [("ippo-detox", "none"), ("ippo-detox", "none-vf0.01"), ("ippo-cot", "none"), ("grpo-detox", "none"),
        ("grpo-add", "none")]  # (task, baseline): the PPO sweep's and GRPO's (docs/ippo.md, docs/grpo.md)


def rlhf():
    import analysis_variants as av
    print("\n### RLHF at equal KL: IIF - the baseline, each run against the baseline's frontier\n")
    print("research/analysis_variants.py frontier --rule runs (results/figures/frontier_verdicts.md, "
          "grpo_frontier_verdicts.md): per seed, IIF's residual minus the baseline's against the baseline's "
          "monotone frontier over its other seeds; Holm over the methods of the task (here IIF's row); the null "
          "check is the baseline's own left-out seeds.\n")
    print("| task | baseline | metric | null check | IIF - baseline | p | p, Holm | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    frontier = os.path.join(ROOT, "results", "frontier", "runs")
    calls = []
    for task, base in RLHF:
        found = analysis.load_runs(frontier, task)
        with open(sorted(glob.glob(os.path.join(frontier, f"{task}__*", "final.json")))[0]) as f:
            final = json.load(f)
        metrics = [m for m in av.FRONTIER_METRICS if m in final]  # the task's
        runs_, _ = av.frontier_runs(frontier, task, found, ["final_kl", *metrics])
        for k in metrics:
            null, extra = av.frontier_family(runs_, base, k, k in av.LOWER_IS_BETTER)
            c = extra.get("influence", {})
            calls.append(c.get("verdict", "no KL in common").split(" over ")[0])
            cell = (f"{c['text']} | {verdicts.p_text(c['p'])} | {verdicts.p_text(c['p_holm'])} | {c['verdict']}"
                    if c.get("n") else "- | - | - | no KL in common")
            print(f"| {task} | {av.frontier_name(base, 'GRPO' if task.startswith('grpo') else 'PPO')} | "
                  f"{av.FRONTIER_METRICS[k]} | {null['text']} (p {verdicts.p_text(null['p'])}) | {cell} |")
    FAMILIES["rlhf"] = ", ".join(f"{w} in {calls.count(w)} of {len(calls)} cells" for w in dict.fromkeys(calls))


def tuned():
    """Each method at its own best learning rate, chosen on the other seeds (research/analysis_variants.py
    sensitivity's leave-one-seed-out): IIF - standard PPO in area, Holm over the six"""
    import analysis_variants as av
    cells = {}
    for e in PAPER_ENVS:
        found, _, left = av.tuned_runs(TUNED, e)
        n_seeds = max(len(seeds) for rates in found.values() for seeds in rates.values())
        candidates = {mt: [m for m, seeds in found[mt].items() if len(seeds) == n_seeds and not any(
            why == "diverged" for _, why in left.get((mt, m), []))] for mt in ("none", "influence")}
        diff, _ = av.leave_one_seed_out(found, candidates)
        if diff:
            cells[e] = diff
    stats = verdicts.family(cells, ".3g")
    FAMILIES["tuned"] = (PAPER_ENVS, {"anti": stats})
    print("\n### Each method at its own best learning rate: IIF - standard PPO in area\n")
    print("results/tuned/runs (results/tuned.py): each seed scores the rate each method reached the highest mean "
          "area with on the other seeds; IIF - standard in area (the mean test return over the compared rounds); "
          "Holm over the six.\n")
    print("| env | seeds | area, IIF - standard | p | p, Holm | verdict |\n|---|---|---|---|---|---|")
    for e in PAPER_ENVS:
        if e in stats:
            c = stats[e]
            print(f"| {e} | {c['n']} | {c['text']} | {verdicts.p_text(c['p'])} | {verdicts.p_text(c['p_holm'])} | "
                  f"{c['verdict']} |")


def listed(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def grouped(title, reading="anti"):
    """'ahead on A and B; behind on C; not detected on D (5 seeds)' of a family's verdicts"""
    envs, stats = FAMILIES[title]
    by = {}
    for e in envs:
        c = stats[reading].get(e)
        word = "no verdict" if c is None or c["n"] < 2 else c["verdict"].split(" over ")[0]
        by.setdefault(word, []).append((SHORT[e], c if word != "no verdict" else None))
    parts = []
    for word in ("ahead", "behind", "not detected", "no verdict"):
        if word in by:
            n = sorted({c["n"] for _, c in by[word] if c})
            seeds = "" if word in ("ahead", "behind") else " (fewer than 2 seeds)" if not n else \
                f" ({n[0]} seeds)" if len(n) == 1 else f" ({n[0]} to {n[-1]} seeds)"
            parts.append(f"{word} on {listed([name for name, _ in by[word]])}{seeds}")
    return "; ".join(parts)


def parted(title):
    envs, stats = FAMILIES[title]
    names = [SHORT[e] for e in envs if e in stats["anti"] and parting(stats, e)]
    return "" if not names else f"; the readings part on {listed(names)}"


def readme_lines():
    """The README's "What holds" bullets, word for word (tests/test_claims.py checks the README has them)"""
    print("\n### The README's lines\n")
    t = "docs/results.md#the-verdicts"
    f6, f6o = "Fig. 6(b): IIF - standard PPO, the paper's six", "Fig. 6(b) outside the paper: IIF - standard PPO"
    lift, lifto = ("A larger step: IIF - standard PPO lifted to IIF's KL each round, the paper's six",
                   "A larger step, outside the paper")
    eq, eqo = ("At an equal step: held IIF - held random (the critic on the kept records), the paper's six",
               "At an equal step, outside the paper")
    cr, cro = ("At an equal step, the critic on every record: held IIF - held random, the paper's six",
               "At an equal step, the critic on every record, outside the paper")
    h = "docs/results.md#iif-at-standard-ppos-step"
    print(f"- **IIF reaches standard PPO's returns in fewer rounds** (Fig. 6(b); [table]({t})): {grouped(f6)}"
          f"{parted(f6)}. Outside the paper: {grouped(f6o)}.")
    print(f"- **Against the paper's figures** (its reading of SE_ave, Welch's test): {FAMILIES['paper']}.")
    print(f"- **A larger step** (IIF against standard PPO lifted to IIF's KL; [table]({h})): {grouped(lift)}"
          f"{parted(lift)}. Outside the paper: {grouped(lifto)}.")
    print(f"- **At an equal step** (held IIF against held random dropping): {grouped(eq)}{parted(eq)}; outside the "
          f"paper: {grouped(eqo)}. With the critic on every record: {grouped(cr)}{parted(cr)}; outside the paper: "
          f"{grouped(cro)}.")
    print(f"- **One round at an equal step**, surrogate gain: {grouped('one round', 'gain')}; test return: "
          f"{grouped('one round', 'test')}.")
    print(f"- **Each method at its own best learning rate** (chosen on other seeds; area): {grouped('tuned')}.")
    print(f"- **RLHF** (Sec. 5.3, at equal KL to the reference): IIF against PPO and GRPO, {FAMILIES['rlhf']} "
          f"([table](docs/ippo.md#at-equal-kl)).")


def main():
    print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
    print("Every cell: mean over seeds [95 % t-interval]; p: the paired t-test of the seeds' differences against 0; "
          "SE in %, area and final return in test return. From `python results/claims.py`.\n")
    null_check()
    print_family("Fig. 6(b): IIF - standard PPO, the paper's six", FIG6B, PAPER_ENVS,
                 "BipedalWalker: results/runs (500 rounds, every 2nd tested on 100 episodes); the others: "
                 "results/held_step.py's standard and influence arms (the preset's test episodes every round).")
    print_family("Fig. 6(b) outside the paper: IIF - standard PPO", FIG6B, OUTSIDE)
    against_paper()
    print_family("A larger step: IIF - standard PPO lifted to IIF's KL each round, the paper's six",
                 held("lifted", "influence"), PAPER_ENVS, "BipedalWalker: its first 100 rounds.")
    print_family("A larger step, outside the paper", held("lifted", "influence"), OUTSIDE)
    print_family("At an equal step: held IIF - held random (the critic on the kept records), the paper's six",
                 held("held-random", "held"), PAPER_ENVS, "Both held to standard PPO's KL each round; "
                 "BipedalWalker: its first 100 rounds.")
    print_family("At an equal step, outside the paper", held("held-random", "held"), OUTSIDE)
    print_family("At an equal step, the critic on every record: held IIF - held random, the paper's six",
                 held("held-random-critic", "held-critic"), PAPER_ENVS,
                 "iif_variants.py --critic-records all: the filter acts on the policy's loss only.")
    print_family("At an equal step, the critic on every record, outside the paper",
                 held("held-random-critic", "held-critic"), OUTSIDE)
    one_round_summary()
    tuned()
    rlhf()
    readme_lines()


PRINTOUT = os.path.join(ROOT, "results", "claims.md")
MARK = re.compile(r"<!-- claims.md: (.+?) -->")


def tables(printout):
    """{heading: its table's lines} of a printout, and README's lines under 'README'"""
    out, heading = {}, None
    for line in printout.splitlines():
        if line.startswith("### "):
            heading = line[4:]
            out[heading] = []
        elif heading and (line.startswith("|") or line.startswith("- ")):
            out[heading].append(line)
    out["README"] = out.pop("The README's lines", [])
    return out


def marked(page):
    """{mark: the lines right after it} of a page: a table's '|' lines, or README's bullets (wrapped)"""
    found, lines = {}, page.splitlines()
    for i, line in enumerate(lines):
        m = MARK.fullmatch(line.strip())
        if m:
            j = i + 1
            while j < len(lines) and (lines[j].startswith(("|", "- ", "  ")) and lines[j].strip()):
                j += 1
            found[m.group(1)] = (i + 1, j)
    return found


def write_docs():
    with open(PRINTOUT) as f:
        got = tables(f.read())
    for name in ("docs/results.md", "README.md"):
        path = os.path.join(ROOT, name)
        with open(path) as f:
            lines = f.read().splitlines()
        for mark, (i, j) in sorted(marked("\n".join(lines)).items(), key=lambda kv: -kv[1][0]):
            new = got[mark] if mark != "README" else [w for b in got[mark] for w in textwrap.wrap(
                b, 100, subsequent_indent="  ", break_on_hyphens=False)]
            lines[i:j] = new
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", action="store_true", help="copy results/claims.md's tables into docs/results.md "
                        "and its lines into README.md, where they are marked")
    write_docs() if parser.parse_args().docs else main()
