"""Finding a profiler's command-line tool (nsys, ncu): `$ENV`, then PATH, then standard installs."""

from __future__ import annotations

import glob
import os
import re
import shutil
from typing import Callable, Iterable


def _version_key(path: str) -> tuple:
    """Sort key putting higher version numbers in a path last ("2025.3.1" > "2024.6.2")."""
    return tuple(int(n) for n in re.findall(r"\d+", path))


def find_executable(name: str, env_var: str, patterns: Iterable[str],
                    bad_env: Callable[[str], Exception]) -> str | None:
    """Path of `name` to use, or None. `$env_var` must name an executable when set (else
    `bad_env(message)` is raised); among standard-install matches the highest version wins."""
    env = os.environ.get(env_var)
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        found = shutil.which(env)
        if found:
            return found
        raise bad_env(f"${env_var} is set to {env!r}, which is not an executable {name}")
    found = shutil.which(name)
    if found:
        return found
    for pattern in patterns:
        matches = [m for m in glob.glob(pattern) if os.path.isfile(m) and os.access(m, os.X_OK)]
        if matches:
            return max(matches, key=_version_key)
    return None
