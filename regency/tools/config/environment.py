"""Monarch's ``monarch.tools.config.environment``: the environment of a ``Workspace``."""

from ...core._workspace import CondaEnvironment, Environment

__all__ = ["CondaEnvironment", "Environment"]
