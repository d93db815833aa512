"""The settings of DEPT(SPEC) (:mod:`fedpeft.methods.dept_spec`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import FederatedConfig


class DeptSpecConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5
