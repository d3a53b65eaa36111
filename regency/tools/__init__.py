"""Monarch's ``monarch.tools``: the workspace configuration (``regency.tools.config``)."""
