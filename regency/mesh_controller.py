"""Monarch's ``monarch.mesh_controller`` name: the error a failed remote tensor op raises."""

from ._tensor_engine._errors import RemoteException

__all__ = ["RemoteException"]
