"""Shared bases and helpers of method families (not methods themselves; registered methods live one module each
in :mod:`fedpeft.methods`):

- ``tiered``, ``rank_tiered``, ``tier_aggregation``, ``tier_costs``: compute tiers (FLAME and the
  resource-adaptive LoRA baselines: trivial LoRA, HetLoRA, FlexLoRA);
- ``branched``: a global and a personal LoRA branch per client, hooked adapters per architecture, compute
  matching and batch replay (FedMosaic's baselines: Ditto, FedSim, FedDAT, SFT in rounds);
- ``distillation``: federated distillation on public data (PerAda, TAKFL, FedMKT);
- ``per_architecture``: any homogeneous method run once per architecture group of a heterogeneous federation;
- ``bayestune``: BayesTune-LoRA's settings and per-client rank scales (``bayestune_lora``, ``fedp2eft``);
- ``lora_keys``: which adapter tensors are A, B or head, and where LoRA goes.

The report code of the methods (the BayesTune methods' rank-scale plots, the merging methods' mixing weights) lives
in :mod:`fedpeft.analysis`, which imports no torch.
"""
