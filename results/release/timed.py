"""Runs one of the released code's Python scripts as `python SCRIPT ARGS` would, and appends a JSON
line about it to $RELEASE_TIMING: the script, its arguments, its wall time (start-up included), the
time after its last PPO.load (the work done on a loaded policy: the influence scores, the IIF
update, a test), and how long each of PPO's collect_rollouts and train calls took (the rollout and
the PPO update of a training process, one entry a round). run_release.sh puts a `python` on PATH
that calls this file, so the released scripts run unchanged."""
import json
import os
import runpy
import sys
import time

start = time.time()
script, sys.argv = sys.argv[1], sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
rec = {"script": os.path.basename(script), "args": " ".join(sys.argv[1:]), "start": start,
       "collect_rollouts": [], "train": []}

with open(script) as f:
    uses_sb3 = "stable_baselines3" in f.read()
if uses_sb3:
    from stable_baselines3 import PPO

    def timed(name):
        method = getattr(PPO, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            out = method(*args, **kwargs)
            rec[name].append(time.perf_counter() - t)
            return out
        setattr(PPO, name, wrapper)

    for name in ("collect_rollouts", "train"):
        timed(name)
    load = PPO.load.__func__

    def timed_load(cls, *args, **kwargs):
        out = load(cls, *args, **kwargs)
        rec["loaded"] = time.time()
        return out
    PPO.load = classmethod(timed_load)

try:
    runpy.run_path(script, run_name="__main__")
finally:
    end = time.time()
    rec["wall"] = end - start
    if "loaded" in rec:
        rec["after_load"] = end - rec.pop("loaded")
    if os.environ.get("RELEASE_TIMING"):
        with open(os.environ["RELEASE_TIMING"], "a") as f:
            f.write(json.dumps(rec) + "\n")
