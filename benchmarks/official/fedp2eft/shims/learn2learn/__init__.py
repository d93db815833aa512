"""Stand-in for learn2learn 0.1.7, which does not install here (setup.sh, README.md).

The authors' code imports one name from it, ``learn2learn.algorithms.base_learner.BaseLearner``, for FedL2P's
inner-loop learner; FedP2EFT, BayesTune-LoRA and LoRA never construct one. The stand-in lets the imports succeed
and fails loudly if FedL2P is run.
"""
