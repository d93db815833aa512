"""The settings of BayesTune-LoRA (:mod:`fedpeft.methods.bayestune_lora`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import BayesTuneSettings


class BayesTuneLoraConfig(BayesTuneSettings):
    """BayesTune-LoRA's settings; stage 1 has the same budget as FedP2EFT's (``stage1_epochs``, ``stage1_steps``)."""
