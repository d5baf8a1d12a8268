"""The envpool backend of iif.py (--env-backend envpool; with auto, the test episodes, and highway's rollout):
envpool's batched C++ environments behind the gymnasium vector API that iif.py uses. Optional:
iif.py imports it only for that backend, and without this file (or without the envpool package)
runs every preset on gymnasium. docs/backends.md compares the two backends.
"""
import importlib
import sys
import types
import warnings

# envpool's __init__ registers all its families (1-2 s of imports: matplotlib, jumanji, MuJoCo...); register only
# those of iif.py's ports (a process that imported envpool before this file keeps them all)
sys.modules.setdefault("envpool.entry", types.ModuleType("envpool.entry"))
import envpool  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

for family in ("box2d", "classic_control", "highway", "minigrid"):
    importlib.import_module(f"envpool.{family}.registration")


class EnvpoolVec:
    """envpool resets a finished environment on its *next* step, which ignores the action and
    returns reward 0 and the first observation: a record that is no transition. This wrapper resets
    it at once instead, as gymnasium's SAME_STEP mode does, so both backends give the buffer the
    same records. reset(seed=s) rebuilds the pool (envpool fixes seeds at creation): environment i
    then runs on seed s + i, as on gymnasium. step(action, env_id) can step only some environments,
    which iif.py's evaluate uses."""

    def __init__(self, env_id, kwargs, num_envs, threads):
        self.env_id, self.kwargs, self.num_envs, self.threads = env_id, kwargs, num_envs, threads
        self.pool = self.make(0)
        space, self.single_action_space = self.pool.observation_space, self.pool.action_space
        # MiniGrid: keep the (7, 7, 3) view, as ImgObsWrapper does
        self.image = isinstance(space, gym.spaces.Dict)
        space = space["image"] if self.image else space
        if len(space.shape) == 2:  # highway's (vehicles, features), flattened as on gymnasium
            space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(space.shape)),), np.float32)
        self.single_observation_space = space

    def make(self, seed):
        pool = envpool.make(self.env_id, env_type="gymnasium", num_envs=self.num_envs, seed=seed,
                            num_threads=self.threads, **self.kwargs)
        # its spaces have float64 bounds, which gymnasium warns it casts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pool.observation_space, pool.action_space  # built on first use, then kept
        return pool

    def obs(self, o):
        o = o["image"] if self.image else o
        return o.reshape(len(o), *self.single_observation_space.shape)

    def reset(self, seed=None):
        if seed is not None:
            self.pool = self.make(seed)
        o, info = self.pool.reset()
        return self.obs(o), info

    def step(self, action, env_id=None, reset=True):
        """Step all environments, or only those in env_id (the returned arrays follow env_id's
        order). reset=False leaves an ended environment as it is, to be stepped no more (a test's
        last episodes: a reset costs a round trip to the pool)."""
        ids = np.arange(self.num_envs) if env_id is None else env_id
        ids = np.asarray(ids, dtype=np.int32)
        o, reward, term, trunc, info = self.pool.step(action, ids)
        o = self.obs(o)
        done = term | trunc
        # the final observation goes to info, the next episode's first one to the caller
        if reset and done.any():
            info["final_obs"] = o.copy()
            o[done] = self.obs(self.pool.reset(ids[done])[0])
        return o, reward, term, trunc, info

    def close(self):
        self.pool.close()
