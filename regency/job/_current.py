"""The current job of a project directory: Monarch's ``set_current_job`` and
``load_current_job``.

The layout is Monarch's, under ``.regency/`` (Regency's name for ``.monarch/``): each
*context* is a directory holding ``spec`` (the job's import path, ``module.attr``) and
``state.pkl`` (the applied job, as ``JobTrait.dump`` writes it, mode 0600); the state file
``.regency/job_state.pkl`` (:data:`DEFAULT_JOB_PATH`, where ``JobTrait.state()`` caches a job
by default) is a symlink to the active context's ``state.pkl``. The first
:func:`set_current_job` makes the ``default`` context, moving a plain ``job_state.pkl`` there.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from ._job import DEFAULT_STATE_PATH, JobTrait

#: The job state file (Monarch's ``.monarch/job_state.pkl``; also ``DEFAULT_STATE_PATH``).
DEFAULT_JOB_PATH: str = DEFAULT_STATE_PATH

_STATE_DIR = os.path.dirname(DEFAULT_JOB_PATH)
_CONTEXT_STATE_FILE = "state.pkl"
_CONTEXT_SPEC_FILE = "spec"


def _current_spec_file() -> Path:
    """The spec file of the active context: the one the state symlink points into, else
    ``default``."""
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        target = Path(os.readlink(link))
        return Path(_STATE_DIR) / target.parent / _CONTEXT_SPEC_FILE
    return Path(_STATE_DIR) / "default" / _CONTEXT_SPEC_FILE


def set_current_job(module_path: str) -> None:
    """Make ``module_path`` (``module.attr``, a :class:`JobTrait` at module level) the job
    of the active context in this directory, for :func:`load_current_job`. Creates
    ``.regency/`` (mode 0700: job states hold secrets) and the ``default`` context on first
    use."""
    if not isinstance(module_path, str) or not module_path.strip():
        raise ValueError(f"module_path must be 'module.attr' (got {module_path!r})")
    link = Path(DEFAULT_JOB_PATH)
    Path(_STATE_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
    if not link.is_symlink():
        default_dir = Path(_STATE_DIR) / "default"
        default_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if link.exists():
            link.rename(default_dir / _CONTEXT_STATE_FILE)  # a plain state file moves in
        link.symlink_to(Path("default") / _CONTEXT_STATE_FILE)
    spec_file = _current_spec_file()
    spec_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    spec_file.write_text(module_path.strip() + "\n")


def _import_job(module_path: str) -> JobTrait:
    """The JobTrait at ``module.attr`` (``module:attr`` too), imported with the working
    directory on ``sys.path`` (as ``regency apply`` does)."""
    if ":" in module_path:
        module_name, _, attr = module_path.partition(":")
    elif "." in module_path:
        module_name, _, attr = module_path.rpartition(".")
    else:
        raise ValueError(f"module_path must be 'module.attr', got {module_path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    job = getattr(module, attr, None)
    if job is None:
        raise AttributeError(f"Module '{module_name}' has no '{attr}' attribute")
    if not isinstance(job, JobTrait):
        raise TypeError(f"'{module_path}' must be a JobTrait, got {type(job).__name__}")
    return job


def load_current_job() -> JobTrait:
    """A fresh job object from the active context's spec (not applied: its ``state()``
    reuses the cached state when it still fits, else applies it). ``FileNotFoundError`` when
    no spec was set."""
    spec_file = _current_spec_file()
    try:
        module_path = spec_file.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No spec found at {spec_file}. Call regency.job.set_current_job('module.attr') "
            "first."
        ) from None
    return _import_job(module_path)


# -- contexts: ``regency context create|use|rm|ls`` (Monarch's ``monarch context``) --------------


def _check_context_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or name.startswith(".")
        or any(c in name for c in "/\\\0\n")
        or name == "logs"
    ):
        raise ValueError(
            "a context name must be a plain directory name such as 'evals', not 'logs' "
            f"(LocalJob's logs live there) (got {name!r})"
        )
    return name


def _context_dir(name: str) -> Path:
    return Path(_STATE_DIR) / _check_context_name(name)


def current_context() -> str | None:
    """The name of the active context (the one ``.regency/job_state.pkl`` points into), or
    None when the state file is a plain file or missing."""
    link = Path(DEFAULT_JOB_PATH)
    if not link.is_symlink():
        return None
    parts = Path(os.readlink(link)).parts
    if len(parts) == 2 and parts[1] == _CONTEXT_STATE_FILE:
        return parts[0]
    return None


def _adopt_plain_state() -> None:
    """A plain ``job_state.pkl`` moves into the ``default`` context (as Monarch's does)."""
    link = Path(DEFAULT_JOB_PATH)
    Path(_STATE_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
    if link.exists() and not link.is_symlink():
        default_dir = Path(_STATE_DIR) / "default"
        default_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        link.rename(default_dir / _CONTEXT_STATE_FILE)
        link.symlink_to(Path("default") / _CONTEXT_STATE_FILE)


def context_create(name: str) -> None:
    """Make the context ``name`` (a directory of ``.regency/``, mode 0700)."""
    directory = _context_dir(name)
    Path(_STATE_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)


def context_use(name: str) -> None:
    """Make ``name`` the active context: ``.regency/job_state.pkl`` points into it (it is
    made when missing)."""
    _adopt_plain_state()
    context_create(name)
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(Path(name) / _CONTEXT_STATE_FILE)


def context_rm(name: str) -> bool:
    """Remove the context ``name``, killing its job first when it has one; the active
    context becomes ``default`` if it was ``name``. False when there was no such context."""
    import shutil

    from ._job import job_load

    directory = _context_dir(name)
    if not directory.is_dir():
        return False
    state = directory / _CONTEXT_STATE_FILE
    if state.exists():
        job_load(str(state)).kill()
    shutil.rmtree(directory)
    if current_context() == name:
        link = Path(DEFAULT_JOB_PATH)
        link.unlink()
        link.symlink_to(Path("default") / _CONTEXT_STATE_FILE)
    return True


def context_ls() -> list[tuple[str, bool]]:
    """Every context, sorted, with whether it is the active one."""
    root = Path(_STATE_DIR)
    if not root.is_dir():
        return []
    active = current_context()
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    return [(name, name == active) for name in names if name != "logs"]
