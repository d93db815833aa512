"""The one class the authors' code imports from learn2learn; constructing it is an error here."""

import torch


class BaseLearner(torch.nn.Module):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "learn2learn is not installed in this environment (benchmarks/official/fedp2eft/README.md); "
            "FedL2P's learner needs it, FedP2EFT does not."
        )
