"""results/release/convert.py on hand-written logs in the released code's formats: rounds, the initial
test, the kept records, and a standard run with later checkpoints tested (none-all)."""
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STD = "result_minigrid_88_sgd_lr-5e-3_feat-64_step-80k_seed-1"


def log_lines(checkpoints_means):
    out = []
    for step, mean in checkpoints_means:
        out += [f"loaded model with initial policy models_minigrid/run/policy_grad_{step}.zip",
                "Generated 100 fixed initial states.",
                f"Average return J over fixed states: {mean}", "Std return J over fixed states: 0.25"]
    return "\n".join(out) + "\n"


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_convert_reads_the_release_logs(tmp_path):
    results = tmp_path / "work" / "traditional-rl" / "minigrid" / "results_minigrid"
    results.mkdir(parents=True)
    (results / f"{STD}.txt").write_text(log_lines([(0, 0.05), (320, 0.1), (640, 0.2)]))
    (results / f"{STD}_rounds-3-4.txt").write_text(log_lines([(960, 0.3), (1280, 0.4)]))
    iif = ("result_minigrid_act7_88_sgd_rollout_train_surrogate_PG-SI-CP-ghostori_adaptive_"
           "rol-0-{k}-{j}_neg-bottom-12.5_gae-lambda-1_2k_lambda_seed-1.txt")
    for k, mean in ((0, 0.15), (1, 0.5)):
        (results / iif.format(k=k, j=k + 1)).write_text(
            f"rollout sample size = 2048\nlen remaining records 1900\n"
            + log_lines([(320 * (k + 1), mean)]))
    out = tmp_path / "out"
    subprocess.run([sys.executable, os.path.join(ROOT, "results", "release", "convert.py"),
                    "--work", str(tmp_path / "work"), "--out", str(out), "--rounds", "2"], check=True)

    none = read(out / "MiniGrid-Empty-8x8-v0__none__1" / "metrics.csv")
    assert [(r["round"], r["test_return_mean"]) for r in none] == [("0", "0.1"), ("1", "0.2")]
    config = json.load(open(out / "MiniGrid-Empty-8x8-v0__none__1" / "config.json"))
    assert config["initial_test_return"] == 0.05 and config["num_rounds"] == 2

    every = read(out / "MiniGrid-Empty-8x8-v0__none-all__1" / "metrics.csv")
    assert [r["test_return_mean"] for r in every] == ["0.1", "0.2", "0.3", "0.4"]
    assert json.load(open(out / "MiniGrid-Empty-8x8-v0__none-all__1" / "config.json"))["num_rounds"] == 4

    filtered = read(out / "MiniGrid-Empty-8x8-v0__influence__1" / "metrics.csv")
    assert [r["test_return_mean"] for r in filtered] == ["0.15", "0.5"]
    assert [(r["n_records"], r["n_kept"], r["n_dropped"]) for r in filtered] == [("2048", "1900", "148")] * 2
