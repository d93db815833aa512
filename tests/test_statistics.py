"""Client feature statistics: the PSG's and FedL2P's view of a client's data."""

from __future__ import annotations

import torch

from fedpeft.adapters import feature_statistics
from fedpeft.models.runtime import ClientModel, LoraSpec


def test_statistics_match_a_direct_computation_and_ignore_padding(toy_runtime, toy_clients):
    # Texts of different lengths, so that batches are padded.
    examples = [
        {**ex, "text": " ".join(ex["text"].split()[: 2 + i % 5])} for i, ex in enumerate(toy_clients[0].train[:10])
    ]
    stats = feature_statistics(toy_runtime, examples, batch_size=3)
    assert stats.shape == (2 * len(toy_runtime.target_modules),)

    # Direct computation for the first targeted layer: capture its inputs one example at a time (no padding).
    name, module = toy_runtime.target_modules[0]
    captured: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda m, inp: captured.append(inp[0].reshape(-1, inp[0].shape[-1])))
    model = toy_runtime.activate(None).eval()
    with torch.no_grad():
        for ex in examples:
            batch = toy_runtime.encode([ex])
            batch.pop("labels")
            model(**batch)
    handle.remove()
    features = torch.cat(captured).double()
    torch.testing.assert_close(stats[0].double(), features.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats[1].double(), features.std(unbiased=False), rtol=1e-5, atol=1e-6)


def test_statistics_bypass_the_active_adapter(toy_runtime, toy_clients):
    examples = toy_clients[1].train[:8]
    plain = feature_statistics(toy_runtime, examples)
    spec = LoraSpec(rank=2, alpha=4.0, targets=("query", "value"))
    toy_runtime.install(ClientModel(lora=spec), seed=1)
    with torch.no_grad():
        for p in toy_runtime.adapter_parameters().values():
            p.add_(0.5)
    with_adapter = feature_statistics(toy_runtime, examples)
    torch.testing.assert_close(with_adapter, plain)
    assert toy_runtime.active == spec  # the active adapter is restored
