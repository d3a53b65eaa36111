"""Monarch's ``monarch.tools.config``: ``Workspace`` (what ``HostMesh.sync_workspace``
copies to the hosts, docs/workspace.md). Monarch's ``Config`` (a torchx job description)
has no Regency counterpart: jobs are ``regency.job`` (docs/jobs.md)."""

from .workspace import Workspace

__all__ = ["Workspace"]
