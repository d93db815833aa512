"""When the server steps (``schedule``, a method setting; how fast clients are is ``clients.speed``, in core.config).

A synchronous schedule (the default) waits for every client sampled in a round. The asynchronous ones keep
``concurrency`` clients training at once, replace each finished client at once by a newly sampled one (which gets
the current global state), and step the server as updates arrive: FedBuff (Nguyen et al., AISTATS 2022) once
``buffer_size`` updates are buffered, FedAsync (Xie et al., 2019) on every update. An update's staleness is the
number of server steps since its client got its state; it is weighted by the ``staleness`` function of it, and one
staler than ``max_staleness`` is rejected. How the server step weights the clients and what an update's difference
is taken from follow fedpeft's choices by default, or APPFL's (``client_weights``, ``delta_from``; docs/async.md
lists each choice).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ScheduleKind = Literal["sync", "fedbuff", "fedasync"]
StalenessKind = Literal["constant", "polynomial", "hinge"]
ClientWeights = Literal["buffer", "equal", "sample_size"]
DeltaFrom = Literal["global", "start"]

FEDASYNC_MIXING = 0.9
"""FedAsync's default mixing weight alpha (APPFL's ``FedAsyncAggregator`` default)."""


class ScheduleConfig(BaseModel):
    """When the server steps: ``sync`` rounds, or asynchronously (``fedbuff``, ``fedasync``).

    Attributes:
        kind: ``sync`` (wait for the round's clients), ``fedbuff`` (step every ``buffer_size`` updates) or
            ``fedasync`` (step on every update).
        concurrency: C, the clients training at once (default: the clients a round samples).
        buffer_size: K, the updates of one FedBuff server step (default: C); FedAsync steps on each (K = 1).
        max_staleness: S, updates staler than this are rejected and recorded (default: none is).
        staleness: the weight of an update of staleness u: ``constant`` 1, ``polynomial`` (u + 1)^-a, ``hinge`` 1
            for u <= b, else 1 / (a (u - b) + 1).
        staleness_a: a of ``polynomial`` and ``hinge``.
        staleness_b: b of ``hinge``.
        server_lr: FedBuff's server learning rate (1: the step is the buffer's weighted mean when every update is
            fresh), or FedAsync's mixing weight alpha (default 0.9).
        client_weights: w_k, a client's weight in the server step: ``buffer`` (fedpeft's: its examples over those
            of the step's updates; 1 under FedAsync), ``equal`` (APPFL's ``client_weights_mode: equal``: 1/N, N
            the clients of the federated phase) or ``sample_size`` (APPFL's: its examples over those of the N).
        delta_from: what an update's difference is taken from: ``global`` (the global state it is mixed into, as
            APPFL's aggregators with updates sent as models) or ``start`` (the state the client trained from, as
            APPFL's with ``send_gradient: True``, its example configs' setting).
    """

    model_config = ConfigDict(extra="forbid")

    kind: ScheduleKind = "sync"
    concurrency: int | None = Field(default=None, ge=1)
    buffer_size: int | None = Field(default=None, ge=1)
    max_staleness: int | None = Field(default=None, ge=0)
    staleness: StalenessKind = "constant"
    staleness_a: float = Field(default=0.5, ge=0)
    staleness_b: float = Field(default=4.0, ge=0)
    server_lr: float | None = Field(default=None, gt=0)
    client_weights: ClientWeights = "buffer"
    delta_from: DeltaFrom = "global"

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleConfig:
        if self.kind == "sync":
            asked = [key for key in ("concurrency", "buffer_size", "max_staleness", "server_lr") if getattr(self, key)]
            defaults = {"client_weights": "buffer", "delta_from": "global"}  # the choices between fedpeft and APPFL
            asked += [key for key, value in defaults.items() if getattr(self, key) != value]
            if asked:
                raise ValueError(f"{', '.join(asked)} apply to an asynchronous schedule; set kind: fedbuff or fedasync")
        if self.kind == "fedasync" and self.buffer_size not in (None, 1):
            raise ValueError("fedasync steps the server on every update; leave out buffer_size (or use fedbuff)")
        if self.buffer_size is not None and self.concurrency is not None and self.buffer_size > self.concurrency:
            raise ValueError(
                f"buffer_size K={self.buffer_size} exceeds concurrency C={self.concurrency}: the buffer would wait "
                "for more updates than clients train at once"
            )
        if self.kind == "fedasync" and self.server_lr is not None and self.server_lr > 1:
            raise ValueError(f"fedasync's mixing weight server_lr must be in (0, 1], not {self.server_lr}")
        return self

    @property
    def asynchronous(self) -> bool:
        return self.kind != "sync"

    @property
    def mixing(self) -> float:
        """The server step's learning rate (FedBuff) or mixing weight (FedAsync)."""
        if self.server_lr is not None:
            return self.server_lr
        return FEDASYNC_MIXING if self.kind == "fedasync" else 1.0

    def weight(self, staleness: int) -> float:
        """The staleness function of ``staleness`` (server steps since the client got its state)."""
        if self.staleness == "polynomial":
            return float((staleness + 1) ** -self.staleness_a)
        if self.staleness == "hinge" and staleness > self.staleness_b:
            return 1.0 / (self.staleness_a * (staleness - self.staleness_b) + 1.0)
        return 1.0
