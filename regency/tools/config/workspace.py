"""Monarch's ``monarch.tools.config.workspace``: ``Workspace``, and what
``HostMesh.sync_workspace`` answers (``WorkspaceSync``, ``HostSync``) or raises
(``WorkspaceError``, ``ReloadError``). See docs/workspace.md."""

from ...core._workspace import (
    ACTIVE_CONDA_ENV,
    HostSync,
    ReloadError,
    Workspace,
    WorkspaceError,
    WorkspaceSync,
)

__all__ = [
    "ACTIVE_CONDA_ENV",
    "HostSync",
    "ReloadError",
    "Workspace",
    "WorkspaceError",
    "WorkspaceSync",
]
