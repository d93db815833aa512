"""FLAME, trivial LoRA, HetLoRA and FlexLoRA: the math on toy tensors (golden numbers), the mixture-of-experts
controls (top-k, rescaler, activation counts, gradients), tiers and sampling, and the methods on a toy OLMoE."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from peft.tuners.lora.layer import ParamWrapper

import fedpeft.methods  # noqa: F401
from fedpeft.adapters.expert_lora import (
    LogWeightedMean,
    activation_log_weights,
    activation_weights,
    join_a,
    join_b,
    product_norms,
    products,
    split_a,
    split_b,
    svd_factors,
    truncate,
    weighted_expert_mean,
    zero_pad,
)
from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate
from fedpeft.merging.server_step import weighted_mean
from fedpeft.methods.hetlora import hetlora_mean
from fedpeft.models.moe import Routing, active_parameters
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.worker import build_method
from tests.conftest import ToyMoeLoaded, toy_moe_model, toy_tokenizer

TOY_TIERS = [
    {"name": "tier1", "top_k": 8, "rank": 4},
    {"name": "tier2", "top_k": 4, "rank": 3},
    {"name": "tier3", "top_k": 2, "rank": 2},
    {"name": "tier4", "top_k": 1, "rank": 1},
]
FAST = {"rounds": 1, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "tiers": TOY_TIERS}


def method(name: str, **fields):
    return build_method({"name": name, **FAST, **fields})


def tokens(runtime, n: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 12, (2, n), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ expert blocks


def test_expert_blocks_follow_peft_layout():
    # E = 2 experts, rank 2, in = 3, out = 2; values name their place: A rows (expert, component).
    a = torch.tensor([[1.0, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]])  # e0c0, e0c1, e1c0, e1c1
    b = torch.tensor([[10.0, 20, 30, 40], [11, 21, 31, 41]])  # columns c0e0, c0e1, c1e0, c1e1
    assert split_a(a, 2)[1].tolist() == [[3, 3, 3], [4, 4, 4]]
    assert split_b(b, 2)[1].tolist() == [[20, 40], [21, 41]]
    torch.testing.assert_close(join_a(split_a(a, 2)), a)
    torch.testing.assert_close(join_b(split_b(b, 2)), b)
    a1, b1 = truncate(a, b, 2, 1)
    assert a1.tolist() == [[1, 1, 1], [3, 3, 3]] and b1.tolist() == [[10, 20], [11, 21]]
    a2, b2 = zero_pad(a1, b1, 2, 2)
    assert a2.tolist() == [[1, 1, 1], [0, 0, 0], [3, 3, 3], [0, 0, 0]]
    assert b2.tolist() == [[10, 20, 0, 0], [11, 21, 0, 0]]
    # Expert 1's update B^1 A^1 = [[20, 40], [21, 41]] @ [[3,3,3], [4,4,4]].
    assert products(a, b, 2)[1].tolist() == [[220.0] * 3, [227.0] * 3]
    torch.testing.assert_close(products(a2, b2, 2), products(a1, b1, 2))
    norms = product_norms(a, b, 2)
    torch.testing.assert_close(norms, torch.linalg.matrix_norm(products(a, b, 2)))


def test_expert_blocks_match_peft_delta_weight(toy_moe_runtime):
    runtime = toy_moe_runtime
    spec = method("flame").spec(runtime, 3)
    runtime.install(ClientModel(lora=spec), seed=0)
    wrappers = [m for m in runtime.peft.modules() if isinstance(m, ParamWrapper)]
    assert {w.parameter_name for w in wrappers} == {"gate_up_proj", "down_proj"}
    for wrapper in wrappers:
        a, b = wrapper.lora_A[spec.key].weight, wrapper.lora_B[spec.key].weight
        with torch.no_grad():
            b.normal_()
        expected = wrapper.get_delta_weight(spec.key)  # (E, out, in)
        assert a.shape[0] == 3 * 8 and b.shape[1] == 3 * 8
        torch.testing.assert_close(products(a, b, 8).float() * wrapper.scaling[spec.key], expected)


# ------------------------------------------------------------------------------- activation-aware averaging


def test_activation_weights_golden():
    freqs = torch.tensor([[0.5, 0.0, 0.2], [0.25, 0.0, 0.0]])
    sizes = torch.tensor([10.0, 30.0])
    weights = activation_weights(freqs, sizes, temperature=2)
    # Expert 0: 0.5^2 * 10 = 2.5 and 0.25^2 * 30 = 1.875; expert 1: nobody; expert 2: client 0 only.
    torch.testing.assert_close(weights[:, 0], torch.tensor([2.5 / 4.375, 1.875 / 4.375], dtype=torch.float64))
    assert weights[:, 1].tolist() == [0.0, 0.0]
    assert weights[:, 2].tolist() == [1.0, 0.0]
    fedavg = activation_weights(freqs, sizes, temperature=0)
    torch.testing.assert_close(fedavg, torch.tensor([[0.25] * 3, [0.75] * 3], dtype=torch.float64))
    assert activation_log_weights(torch.tensor([0.0]), 5.0, 3.0).item() == -math.inf


def test_log_space_keeps_tiny_weights_exact():
    # f^8 of 1e-45 underflows float64 (1e-360) in linear space, but not in log space.
    blocks = [torch.full((1, 2), 1.0), torch.full((1, 2), 3.0)]
    logs = [activation_log_weights(torch.tensor([f], dtype=torch.float64), 1.0, 8.0) for f in (1e-45, 2e-45)]
    mean = weighted_expert_mean(blocks, logs, previous=torch.zeros(1, 2))
    expected = (1.0 + 3.0 * 2**8) / (1 + 2**8)
    torch.testing.assert_close(mean, torch.full((1, 2), expected))


def test_streaming_mean_equals_batch_weights():
    torch.manual_seed(0)
    freqs = torch.rand(5, 4)
    freqs[2, 1] = 0.0
    sizes = torch.tensor([3.0, 9.0, 1.0, 4.0, 7.0])
    blocks = torch.randn(5, 4, 2, 3, dtype=torch.float64)
    mean = LogWeightedMean()
    for i in range(5):
        mean.add(blocks[i], activation_log_weights(freqs[i], float(sizes[i]), 2.0))
    weights = activation_weights(freqs, sizes, 2.0)
    expected = (weights[:, :, None, None] * blocks).sum(0)
    torch.testing.assert_close(mean.result(torch.zeros(4, 2, 3, dtype=torch.float64)), expected)


def flame_update(client: str, a: torch.Tensor, b: torch.Tensor, weight: float, counts, tokens: float = 10.0):
    tensors = {"m.experts.lora_A.weight": a, "m.experts.lora_B.weight": b, "m.attn.lora_A.weight": a[:1] * weight}
    extras = {"expert_counts": {"blk": torch.tensor(counts, dtype=torch.float64)}, "expert_tokens": {"blk": tokens}}
    return ClientUpdate(client, tensors, weight, {"loss": 1.0}, extras)


def flame_state(a: torch.Tensor, b: torch.Tensor):
    from fedpeft.methods.families.tiered import TieredState

    layout = {"m.experts": {"key": "m.experts", "experts": 2, "block": "blk"},
              "m.attn": {"key": "m.attn", "experts": 1, "block": None}}  # fmt: skip
    tensors = {"m.experts.lora_A.weight": a, "m.experts.lora_B.weight": b, "m.attn.lora_A.weight": a[:1]}
    return TieredState(tensors=tensors, lora_layout=layout)


def test_flame_aggregation_golden():
    # Two experts of rank 1 (in = out = 1): A rows [e0, e1], B columns [e0, e1].
    previous = flame_state(torch.tensor([[9.0], [9.0]]), torch.tensor([[9.0, 9.0]]))
    u1 = flame_update("c1", torch.tensor([[1.0], [5.0]]), torch.tensor([[2.0, 6.0]]), 10.0, [5.0, 0.0])
    u2 = flame_update("c2", torch.tensor([[3.0], [7.0]]), torch.tensor([[4.0, 8.0]]), 30.0, [2.5, 0.0])
    flame = method("flame", temperature=2.0)
    state, metrics = flame.aggregate(previous, iter([u1, u2]))
    w1 = 0.5**2 * 10 / (0.5**2 * 10 + 0.25**2 * 30)
    a = state.tensors["m.experts.lora_A.weight"]
    b = state.tensors["m.experts.lora_B.weight"]
    torch.testing.assert_close(a[0, 0], torch.tensor(w1 * 1 + (1 - w1) * 3))
    torch.testing.assert_close(b[0, 0], torch.tensor(w1 * 2 + (1 - w1) * 4))
    # Expert 1 was activated by no client: it keeps its previous value.
    assert a[1, 0].item() == 9.0 and b[0, 1].item() == 9.0
    # Attention LoRA: FedAvg by data size.
    attention = torch.tensor([[(1 * 10 * 10 + 3 * 30 * 30) / 40]])
    torch.testing.assert_close(state.tensors["m.attn.lora_A.weight"], attention)
    assert metrics["clients"] == 2.0 and state.round == previous.round  # the round loop counts the rounds


def test_flame_zero_activation_gives_zero_weight_and_t0_is_fedavg():
    previous = flame_state(torch.zeros(2, 1), torch.zeros(1, 2))
    u1 = flame_update("c1", torch.tensor([[1.0], [5.0]]), torch.tensor([[2.0, 6.0]]), 10.0, [4.0, 0.0])
    u2 = flame_update("c2", torch.tensor([[3.0], [7.0]]), torch.tensor([[4.0, 8.0]]), 30.0, [0.0, 3.0])
    state, _ = method("flame", temperature=2.0).aggregate(previous, iter([u1, u2]))
    # Each expert was activated by one client only: it takes that client's block exactly.
    assert state.tensors["m.experts.lora_A.weight"].tolist() == [[1.0], [7.0]]
    assert state.tensors["m.experts.lora_B.weight"].tolist() == [[2.0, 8.0]]
    fedavg, _ = method("flame", temperature=0.0).aggregate(previous, iter([u1, u2]))
    plain = weighted_mean(iter([u1, u2]))
    for key, tensor in plain.items():
        torch.testing.assert_close(fedavg.tensors[key], tensor)


# ------------------------------------------------------------------------------------- HetLoRA / FlexLoRA


def test_hetlora_pads_and_weights_by_update_norm():
    # Plain module (E = 1), in = out = 2. Client 1 rank 2: B1 A1 = diag(3, 4), norm 5. Client 2 rank 1:
    # B2 A2 = [[1, 0], [0, 0]] (norm 1), padded with a zero component.
    a1, b1 = torch.eye(2), torch.diag(torch.tensor([3.0, 4.0]))
    a2, b2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0], [0.0]])
    previous = (torch.zeros(2, 2), torch.zeros(2, 2))
    a, b = hetlora_mean([(a1, b1), (a2, b2)], experts=1, rank=2, previous=previous)
    torch.testing.assert_close(a, (5 * a1 + 1 * torch.tensor([[1.0, 0.0], [0.0, 0.0]])) / 6)
    torch.testing.assert_close(b, (5 * b1 + 1 * torch.tensor([[1.0, 0.0], [0.0, 0.0]])) / 6)


def test_flexlora_svd_redistribution_golden():
    # B1 A1 = diag(3, 0), B2 A2 = diag(0, 1), equal data: the mean is diag(1.5, 0.5).
    f1 = (torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0], [0.0]]))
    f2 = (torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0], [1.0]]))
    a, b = svd_factors([f1, f2], [1.0, 1.0], experts=1, rank=2)
    torch.testing.assert_close(b @ a, torch.diag(torch.tensor([1.5, 0.5], dtype=torch.float64)))
    a1, b1 = svd_factors([f1, f2], [1.0, 1.0], experts=1, rank=1)
    torch.testing.assert_close(b1 @ a1, torch.diag(torch.tensor([1.5, 0.0], dtype=torch.float64)))
    # B = U S: its column norm is the singular value; A = V^T has orthonormal rows.
    assert abs(b1.norm().item() - 1.5) < 1e-12 and abs(a1.norm().item() - 1.0) < 1e-12
    # Rank 3 from two rank-1 updates: the extra component is zero.
    a3, b3 = svd_factors([f1, f2], [1.0, 1.0], experts=1, rank=3)
    assert a3.shape == (3, 2) and b3.shape == (2, 3) and b3[:, 2].abs().max() == 0


def test_flexlora_equals_the_svd_of_the_mean_product_per_expert():
    torch.manual_seed(1)
    experts, out, inp = 3, 5, 4
    factors = [(torch.randn(r * experts, inp), torch.randn(out, r * experts)) for r in (3, 1, 2)]
    weights = [1.0, 2.0, 5.0]
    mean = sum(w * products(a, b, experts) for (a, b), w in zip(factors, weights, strict=True)) / sum(weights)
    for rank in (1, 2, 4):
        a, b = svd_factors(factors, weights, experts, rank)
        u, s, vh = torch.linalg.svd(mean)
        expected = u[:, :, :rank] @ torch.diag_embed(s[:, :rank]) @ vh[:, :rank]
        torch.testing.assert_close(products(a, b, experts), expected)


# ----------------------------------------------------------------------------------- mixture-of-experts


def test_lower_top_k_routes_fewer_expert_computations(toy_moe_runtime):
    runtime = toy_moe_runtime
    moe = runtime.moe
    dispatched: list[int] = []
    experts = runtime.base_model.model.layers[0].mlp.experts
    handle = experts.register_forward_pre_hook(lambda m, args: dispatched.append(args[1].numel()))
    ids = tokens(runtime)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # two padding positions: processed, never counted
    try:
        for k in (8, 4, 2, 1):
            runtime.install(ClientModel(routing=Routing(top_k=k)))
            with torch.no_grad(), moe.counting() as counts:
                runtime.base_model(input_ids=ids, attention_mask=mask)
            block = next(iter(counts.counts))
            assert counts.tokens[block] == 10.0
            assert counts.counts[block].sum().item() == 10.0 * k
            assert dispatched[-1] == ids.numel() * k  # (token, expert) pairs the experts compute
            freqs = counts.frequencies()[block]
            assert 0.0 <= freqs.min() and freqs.max() <= 1.0 and abs(freqs.sum().item() - k) < 1e-9
    finally:
        handle.remove()
    assert dispatched == sorted(dispatched, reverse=True) and dispatched[0] == 8 * dispatched[-1]
    runtime.install(ClientModel())
    assert moe.top_k == 8
    with pytest.raises(UserError, match="top_k=9 is impossible"):
        moe.set_top_k(9)


def balancing_loss(router_logits: list[torch.Tensor], mask: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss written out: E x sum_j f_j P_j over the real tokens of all
    blocks together, f_j = tokens routed to expert j per token (summing to top-k), P_j = mean router probability."""
    probs = torch.cat([logits.softmax(-1)[mask] for logits in router_logits])
    chosen = torch.zeros_like(probs).scatter_(1, probs.topk(top_k, dim=-1).indices, 1.0)
    return probs.shape[1] * (chosen.mean(0) * probs.mean(0)).sum()


def test_router_balancing_adds_the_load_balancing_loss_and_restores_the_model():
    from fedpeft.models.moe import router_balancing

    model = toy_moe_model(num_experts=8, top_k=2, layers=2)
    model.eval()
    ids = tokens(None, n=5)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # padding is left out of the balance
    logits: list[torch.Tensor] = []
    handles = [
        layer.mlp.gate.register_forward_hook(lambda m, a, out: logits.append(out[0])) for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            plain = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            logits.clear()
            with router_balancing(model, 0.5) as coef:
                balanced = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            assert coef == 0.5
            expected = balancing_loss(logits, mask.reshape(-1).bool(), top_k=2)
            torch.testing.assert_close(balanced, plain + 0.5 * expected)
            with router_balancing(model) as coef:  # the config's own coefficient (OLMoE: 0.01)
                assert coef == model.config.router_aux_loss_coef == 0.01
            with router_balancing(model, 0.0) as coef:
                torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, labels=ids).loss, plain)
            assert coef == 0.0
    finally:
        for handle in handles:
            handle.remove()
    assert model.config.output_router_logits is False and model.router_aux_loss_coef == 0.01
    dense = torch.nn.Linear(2, 2)
    with router_balancing(dense, 0.5) as coef:  # a model without the loss is left alone
        assert coef == 0.0


def test_centralized_base_stage_adds_the_balance_loss_on_request(toy_moe_clients):
    from fedpeft.base_models import train_centralized_base
    from fedpeft.core.config import BaseStageConfig

    examples = [ex for client in toy_moe_clients for ex in client.train]
    trained = {}
    for coef in (0.0, 1.0):
        runtime = ModelRuntime(ToyMoeLoaded(toy_moe_model(top_k=2), toy_tokenizer()))
        base = BaseStageConfig(kind="centralized", epochs=1, lr=1e-2, batch_size=16, router_aux_loss=coef)
        metrics = train_centralized_base(runtime, examples, base)
        assert metrics["steps"] == 6 and runtime.base_model.config.output_router_logits is False
        trained[coef] = runtime.base_state()
    router = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(trained[0.0][router], trained[1.0][router])  # the balance loss moved the router
    assert BaseStageConfig().router_aux_loss == 0.0  # off unless asked for
    with pytest.raises(ValueError):
        BaseStageConfig(router_aux_loss=-1.0)


def test_expert_never_routed_gets_no_gradient(toy_moe_runtime):
    runtime = toy_moe_runtime
    spec = method("flame").spec(runtime, 2)
    model = runtime.install(ClientModel(lora=spec, routing=Routing(top_k=1)), seed=0)
    for wrapper in (m for m in runtime.peft.modules() if isinstance(m, ParamWrapper)):
        with torch.no_grad():
            wrapper.lora_B[spec.key].weight.normal_()
    ids = tokens(runtime, n=3)
    with runtime.moe.counting() as counts:
        model(input_ids=ids, labels=ids).loss.backward()
    routed = next(iter(counts.counts.values())) > 0
    assert 0 < int(routed.sum()) < 8  # some experts got tokens, some none
    for wrapper in (m for m in runtime.peft.modules() if isinstance(m, ParamWrapper)):
        grad_a = split_a(wrapper.lora_A[spec.key].weight.grad, 8).abs().sum(dim=(1, 2))
        grad_b = split_b(wrapper.lora_B[spec.key].weight.grad, 8).abs().sum(dim=(1, 2))
        assert torch.all(grad_a[~routed] == 0) and torch.all(grad_b[~routed] == 0)
        # Routed experts learn (all but those whose only token is the last one, which has no label).
        assert grad_a[routed].sum() > 0 and grad_b[routed].sum() > 0
    model.zero_grad(set_to_none=True)


def test_rescaler_scales_every_moe_output(toy_moe_runtime):
    runtime = toy_moe_runtime
    block = runtime.base_model.model.layers[0].mlp
    seen: list[torch.Tensor] = []
    handle = block.register_forward_hook(lambda m, args, out: seen.append(out))  # runs after the rescaler
    try:
        with torch.no_grad():
            for scale in (1.0, 2.5):
                runtime.install(ClientModel(routing=Routing(top_k=2, scale=scale)))
                runtime.base_model(input_ids=tokens(runtime))
    finally:
        handle.remove()
    torch.testing.assert_close(seen[1], 2.5 * seen[0])


@pytest.mark.parametrize(
    ("mode", "init", "expected"), [("none", "one", 1.0), ("static", "one", 8.0), ("learned", "ratio", 8.0)]
)
def test_rescaler_modes(mode, init, expected, toy_moe_runtime, toy_moe_clients):
    runtime, client = toy_moe_runtime, toy_moe_clients[3]  # c3 -> tier4, top-1
    flame = method("flame", rescaler=mode, rescaler_init=init, rescaler_lr=0.5)
    state = flame.init_server(runtime, seed=0)
    tier = flame.tier_of(client.client_id)
    assert tier.top_k == 1 and flame.rescaler(runtime, tier, None) == expected
    update, client_state = flame.client_update(runtime, client, flame.payload(state, "c3"), None, seed=1)
    learned = client_state["rescaler"]
    assert update.metrics["rescaler"] == learned and "rescaler" not in str(list(update.tensors))
    if mode == "learned":
        assert learned != expected  # trained along with the LoRA, starting from k / k_i
    else:
        assert learned == expected
    model = flame.personalize(runtime, client, state, client_state, "tier4", seed=2)
    assert model.routing == Routing(top_k=1, scale=learned)


def test_learned_rescaler_trains_at_the_lora_learning_rate_unless_given_its_own(toy_moe_runtime, toy_moe_clients):
    # The paper trains s_i in the client's one Adam (lr 1.5e-4): an Adam step moves a scalar by about lr, so two
    # steps at lr 1e-3 move s_i by at most ~2e-3; its own rate (here 5e-2) moves it much further.
    runtime, client = toy_moe_runtime, toy_moe_clients[3]
    moved = {}
    for rescaler_lr in (None, 5e-2):
        flame = method("flame", lr=1e-3, rescaler_lr=rescaler_lr)
        state = flame.init_server(runtime, seed=0)
        _, client_state = flame.client_update(runtime, client, flame.payload(state, "c3"), None, seed=1)
        moved[rescaler_lr] = abs(client_state["rescaler"] - 1.0)
    assert flame.cfg.local_steps == 2 and method("flame").cfg.rescaler_lr is None
    assert 0 < moved[None] <= 2.5e-3
    assert moved[5e-2] > 10 * moved[None]


def test_flame_round_counts_only_what_the_client_routed(toy_moe_runtime, toy_moe_clients):
    flame = method("flame")
    state = flame.init_server(toy_moe_runtime, seed=0)
    update, _ = flame.client_update(toy_moe_runtime, toy_moe_clients[2], flame.payload(state, "c2"), None, seed=1)
    ((block, counts),) = update.extras["expert_counts"].items()
    tokens_seen = update.extras["expert_tokens"][block]
    assert tokens_seen > 0 and counts.sum().item() == 2 * tokens_seen  # c2 is tier3: top-2
    assert set(update.tensors) == set(state.tensors)
    new_state, metrics = flame.aggregate(state, iter([update]))
    assert new_state.round == state.round and metrics["train_rescaler"] == update.metrics["rescaler"]
    unrouted = (counts == 0).nonzero().flatten().tolist()
    for key, module in flame.modules(state.lora_layout).items():
        if module.block is None:
            continue
        before = split_a(state.tensors[f"{key}.lora_A.weight"], module.experts)
        after = split_a(new_state.tensors[f"{key}.lora_A.weight"], module.experts)
        for expert in unrouted:
            torch.testing.assert_close(after[expert], before[expert])


def test_flame_refuses_a_dense_model(toy_runtime):
    with pytest.raises(UserError, match="flame needs a sparse mixture-of-experts model"):
        method("flame").init_server(toy_runtime, seed=0)


# ------------------------------------------------------------------------------------------------ tiers


def test_tiers_round_robin_by_client_number_and_explicit_mapping():
    flame = method("flame", client_tiers={"client-07": "tier1"})
    ids = [f"client-{i:02d}" for i in range(40)]
    by_tier: dict[str, int] = {}
    for client_id in ids:
        name = flame.tier_of(client_id).name
        by_tier[name] = by_tier.get(name, 0) + 1
    assert by_tier == {"tier1": 11, "tier2": 10, "tier3": 10, "tier4": 9}  # client-07 moved from tier4
    assert [flame.tier_of(f"c{i}").name for i in range(4)] == ["tier1", "tier2", "tier3", "tier4"]
    with pytest.raises(UserError, match="no number at the end"):
        flame.tier_of("alice")
    with pytest.raises(UserError, match="unknown tier"):
        method("flame", client_tiers={"c0": "tier9"})


def test_per_tier_participation_sampling():
    tiers = [dict(t, participation=p) for t, p in zip(TOY_TIERS, (1.0, 0.5, 0.25, None), strict=True)]
    flame = method("flame", tiers=tiers, fraction=0.2)
    ids = [f"client-{i:02d}" for i in range(40)]
    for round_ in range(3):
        chosen = flame.sample(ids, round_, seed=0)
        per_tier = [sum(flame.tier_of(c).name == f"tier{t}" for c in chosen) for t in (1, 2, 3, 4)]
        assert per_tier == [10, 5, 3, 2]  # ceil(rate * 10); tier4 falls back to fraction 0.2
    assert flame.sample(ids, 0, 0) == flame.sample(ids, 0, 0) != flame.sample(ids, 1, 0)
    uniform = method("flame", fraction=0.5)
    assert len(uniform.sample(ids, 0, 0)) == 20


def test_baselines_download_their_tier_rank_and_evaluate_at_the_tier_top_k(toy_moe_runtime, toy_moe_clients):
    for name in ("hetlora", "flexlora"):
        baseline = method(name)
        state = baseline.init_server(toy_moe_runtime, seed=0)
        expert_a = next(k for k, m in state.lora_layout.items() if m["experts"] == 8) + ".lora_A.weight"
        assert state.tensors[expert_a].shape[0] == 4 * 8  # the largest tier rank, per expert
        payload = baseline.payload(state, "c3")  # tier4: rank 1
        assert payload.config["rank"] == 1 and payload.tensors[expert_a].shape[0] == 8
        update, _ = baseline.client_update(toy_moe_runtime, toy_moe_clients[3], payload, None, seed=1)
        assert update.tensors[expert_a].shape[0] == 8
        new_state, _ = baseline.aggregate(state, iter([update]))
        assert new_state.tensors[expert_a].shape == state.tensors[expert_a].shape
        model = baseline.personalize(toy_moe_runtime, toy_moe_clients[3], new_state, None, "tier4", seed=2)
        assert model.lora.rank == 1 and model.routing == Routing(top_k=1, scale=1.0)
        # Every rank has the global adapter's scaling alpha / r_max.
        assert model.lora.alpha / model.lora.rank == 16.0 / 4
    trivial = method("trivial_lora")
    assert {trivial.rank_for(t) for t in trivial.cfg.tiers} == {1} and trivial.spec(toy_moe_runtime, 1).alpha == 16.0


def test_hetlora_self_pruning_shrinks_the_rank(toy_moe_runtime, toy_moe_clients):
    fields = {"self_pruning": True, "prune_gamma": 0.5, "lr": 5e-2, "local_steps": 4}
    free, pruning = method("hetlora", **fields, prune_lambda=0.0), method("hetlora", **fields, prune_lambda=100.0)
    state = free.init_server(toy_moe_runtime, seed=0)
    client = toy_moe_clients[0]  # tier1: rank 4
    update, client_state = free.client_update(toy_moe_runtime, client, free.payload(state, "c0"), None, seed=1)
    assert client_state["rank"] == 4 and client_state["tail_norm"] > 0  # the first round never prunes
    update, client_state = pruning.client_update(
        toy_moe_runtime, client, pruning.payload(state, "c0"), client_state, seed=1
    )
    assert client_state["rank"] == 2 and update.metrics["rank"] == 2.0  # the penalized tail shrank: pruned
    expert_a = next(k for k, m in state.lora_layout.items() if m["experts"] == 8) + ".lora_A.weight"
    assert update.tensors[expert_a].shape[0] == 2 * 8
    new_state, _ = pruning.aggregate(state, iter([update]))
    assert new_state.tensors[expert_a].shape[0] == 4 * 8
    model = pruning.personalize(toy_moe_runtime, client, new_state, client_state, "tier1", seed=2)
    assert model.lora.rank == 2


def test_worker_records_the_tier_as_budget_and_compute_costs(toy_moe_worker_factory, toy_moe_runtime):
    entry = {"name": "flame", **FAST, "eval_tiers": ["tier1", "tier4"], "compute_repeats": 1, "compute_tokens": 16}
    worker = toy_moe_worker_factory([entry])
    flame = worker.methods["flame"]
    state = flame.init_server(toy_moe_runtime, seed=0)
    budgets = {}
    for client_id in ("c0", "c1", "c3"):
        records, _ = worker.personalize("flame", 0, client_id, state)
        budgets[client_id] = {r["budget"] for r in records}
    assert budgets == {"c0": {"tier1"}, "c1": set(), "c3": {"tier4"}}
    lora_calls: list[str] = []
    handles = [
        module.register_forward_hook(lambda m, args, out, n=name: lora_calls.append(n))
        for name, module in toy_moe_runtime.peft.named_modules()
        if ".lora_A." in name
    ]
    try:
        rows = flame.compute_costs(toy_moe_runtime, seed=0)
    finally:
        for handle in handles:
            handle.remove()
    assert handles and not lora_calls  # timed as deployed: the LoRA merged, i.e. the base model at the tier's top-k
    value = {(r["budget"], r["metric"]): r["value"] for r in rows}
    assert {b for b, _ in value} == {"tier1", "tier4"}
    assert value["tier1", "top_k"] == 8 and value["tier4", "top_k"] == 1
    # One expert: gate_up (16 x 32) and down (32 x 8) weights; its rank-20 LoRA: 20 x (32 + 16) + 20 x (8 + 32).
    expert, expert_lora = 16 * 32 + 32 * 8, 20 * (32 + 16) + 20 * (8 + 32)
    assert value["tier1", "active_params"] - value["tier4", "active_params"] == 7 * (expert + expert_lora)
    assert value["tier4", "forward_flops"] == 2 * 16 * value["tier4", "active_params"]
    assert value["tier1", "forward_ms"] > 0
    raw = toy_moe_model()
    assert active_parameters(raw) - active_parameters(raw, top_k=1) == 7 * expert


# ----------------------------------------------------------------------------------- outputs and presets


def test_flame_pipeline_records_tiers_and_compute(tmp_path):
    from fedpeft.core.config import load_config
    from fedpeft.runner import Experiment

    cfg = load_config(
        "flame-cpu-4",
        [
            "seeds=[0]",
            "data.options.samples=160",
            "data.base_samples=48",
            "base.epochs=1",
            "eval.max_new_tokens=3",
            "methods=[{name: flame, rounds: 1, local_epochs: null, local_steps: 1, compute_repeats: 1}, "
            "{name: trivial_lora, label: base-at-tier, rounds: 0, compute_repeats: 1}]",
            "output.save_adapters=true",
        ],
    )
    out = Experiment(cfg, tmp_path / "run").run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tiers = {r["client"]: r["budget"] for r in records if r["method"] == "flame" and r["split"] != "train"}
    assert tiers == {"client-00": "tier1", "client-01": "tier2", "client-02": "tier3", "client-03": "tier4"}
    assert {r["budget"] for r in records if r["method"] == "base"} == {None}
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    flops = {c["budget"]: c["value"] for c in costs if c["method"] == "flame" and c["metric"] == "forward_flops"}
    assert flops["tier1"] > flops["tier2"] > flops["tier3"] > flops["tier4"] > 0
    summary = (out / "summary.md").read_text()
    assert "## Compute per budget" in summary
    for tier, top_k in (("tier1", 8), ("tier2", 4), ("tier3", 2), ("tier4", 1)):  # a row per tier, none dropped
        assert f"| flame | {tier} | {top_k} | 20 |" in summary
    assert "### tier4 — ROUGE-L" in summary
    # The saved adapter loads with plain PEFT and, run at its routing, gives the runtime's logits.
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from fedpeft.models.moe import MoeControl
    from fedpeft.worker import Worker

    adapter_dir = out / "adapters" / "flame" / "tier4" / "client-03"
    routing = Routing(**json.loads((adapter_dir / "routing.json").read_text()))
    assert routing.top_k == 1 and routing.scale != 1.0  # the learned rescaler travels with the adapter
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["target_parameters"]
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out / "base_model"), adapter_dir).eval()
    control = MoeControl.of(loaded.get_base_model())
    control.configure(routing)
    worker = Worker(cfg, out)
    worker.bases.use_base(0)
    flame = worker.methods["flame"]
    model = worker.runtime.install(
        ClientModel(
            lora=flame.spec(worker.runtime, 20),
            adapter=load_file(adapter_dir / "adapter_model.safetensors"),
            routing=routing,
        )
    )
    batch = worker.runtime.encode(worker.clients["client-03"].test)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=1e-5, rtol=1e-4)


def test_temperature_sweep_plot(tmp_path):
    import yaml

    from fedpeft.report import method_sweeps, write_sweep_plots

    run = tmp_path / "sweep"
    run.mkdir()
    entries = [{"name": "flame", "label": f"flame-t{t}", "temperature": t} for t in (0, 2, 8)]
    entries.append({"name": "hetlora"})
    (run / "config.yaml").write_text(yaml.safe_dump({"methods": entries}))
    rows = [
        {"method": f"flame-t{t}", "budget": tier, "pool": "seen", "client": f"c{tier}", "group": "g", "seed": seed,
         "round": 2, "split": "test", "metric": "rougeL", "value": 0.1 * t + 0.01 * seed}
        for t in (0, 2, 8) for tier in ("tier1", "tier4") for seed in (0, 1)
    ]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert method_sweeps([run]) == {("flame", "temperature"): {"flame-t0": 0.0, "flame-t2": 2.0, "flame-t8": 8.0}}
    written = write_sweep_plots([run], tmp_path / "plots")
    assert [p.name for p in written] == ["sweep_flame_temperature.png"] and written[0].stat().st_size > 0


@pytest.mark.parametrize(
    "name",
    ["flame-cpu-4", "flame-cpu-4-dense", "flame-cpu-40", "flame-cpu-40-dense", "flame-temperature",
     "flame-rescaler", "flame-dolly", "flame-dolly-dense", "flame-alpagasus", "flame-alpagasus-dense"],
)  # fmt: skip
def test_flame_presets_validate(name, tmp_path):
    import fedpeft.data.catalog  # noqa: F401  (registers the dataset builders)
    from fedpeft.core.config import load_config
    from fedpeft.core.registry import DATASETS
    from fedpeft.methods.families.tiered import TieredConfig
    from fedpeft.models.table import model_names
    from fedpeft.runner import Experiment

    cfg = load_config(name)
    Experiment(cfg, tmp_path / "run")  # checks the method entries across each other
    assert cfg.data.name in DATASETS and len(cfg.seeds) == 3
    assert cfg.model.name in model_names() or cfg.model.name.startswith("allenai/")
    kinds = {m.name for m in cfg.methods}  # every entry was validated into its typed config
    assert cfg.methods and kinds <= {"flame", "trivial_lora", "hetlora", "flexlora"}
    for entry in cfg.methods:
        assert isinstance(entry, TieredConfig)
        tiers = [t.name for t in entry.tiers]
        assert tiers == ["tier1", "tier2", "tier3", "tier4"]
        if "dense" in name:
            assert entry.eval_tiers == ["tier1"] and max(t.rank for t in entry.tiers) == 40


@pytest.mark.parametrize("name", ["flame-cpu-4", "flame-cpu-40"])
def test_dense_reference_presets_share_data_and_base_stage(name):
    from fedpeft.core.config import load_config

    moe, dense = load_config(name), load_config(f"{name}-dense")
    assert moe.data == dense.data and moe.base == dense.base
    assert {"add", "multiply"} <= set(moe.data.options["categories"]) & set(moe.data.options["base_categories"])
    assert (moe.model.name, dense.model.name) == ("tiny-olmoe", "tiny-olmo")


def test_flame_update_travels_in_a_flower_message(toy_moe_runtime, toy_moe_clients):
    from fedpeft.engine.flower import decode, encode

    flame = method("flame")
    state = flame.init_server(toy_moe_runtime, seed=0)
    update, _ = flame.client_update(toy_moe_runtime, toy_moe_clients[1], flame.payload(state, "c1"), None, seed=1)
    back = decode(encode(update))
    assert back.extras["expert_tokens"] == update.extras["expert_tokens"]
    for block, counts in update.extras["expert_counts"].items():
        torch.testing.assert_close(back.extras["expert_counts"][block], counts)
    merged, _ = flame.aggregate(state, iter([back]))
    direct, _ = flame.aggregate(state, iter([update]))
    for key, tensor in direct.tensors.items():
        torch.testing.assert_close(merged.tensors[key], tensor)


def test_router_lora_and_training_at_the_tier_top_k(toy_moe_runtime, toy_moe_clients):
    flame = method("flame", lora_router=True)
    state = flame.init_server(toy_moe_runtime, seed=0)
    router = [k for k, m in state.lora_layout.items() if k.endswith("mlp.gate")]
    assert router and state.lora_layout[router[0]]["experts"] == 1  # a plain LoRA, averaged by |D|
    update, _ = flame.client_update(toy_moe_runtime, toy_moe_clients[0], flame.payload(state, "c0"), None, seed=1)
    assert not torch.equal(update.tensors[f"{router[0]}.lora_B.weight"], state.tensors[f"{router[0]}.lora_B.weight"])
    with pytest.raises(UserError, match="give every method the same lora_router setting"):
        method("hetlora").init_server(toy_moe_runtime, seed=0)
    runtime = ModelRuntime(ToyMoeLoaded(toy_moe_model(), toy_tokenizer()))
    at_tier = method("hetlora", train_top_k="tier")
    seen: list[int] = []
    handle = runtime.base_model.model.layers[0].mlp.gate.register_forward_hook(
        lambda m, args, out: seen.append(out[-1].shape[-1])
    )
    try:
        hstate = at_tier.init_server(runtime, seed=0)
        at_tier.client_update(runtime, toy_moe_clients[2], at_tier.payload(hstate, "c2"), None, seed=1)
    finally:
        handle.remove()
    assert set(seen) == {2}  # c2 is tier3: trains at top-2


# ------------------------------------------------------------------------------- predictions with expert LoRA


def test_a_prediction_forms_each_expert_lora_once_with_the_per_pass_outputs(
    toy_moe_runtime, toy_moe_clients, monkeypatch
):
    """Generation with a LoRA on the fused experts: each adapted expert tensor is formed once per prediction, not
    at every forward pass (the prompt's and each decoding step's), and the responses are those of forming it at
    every pass, to the token; afterwards the layers form per pass again and train as before."""
    from peft.tuners.lora import layer as peft_layer

    import fedpeft.models.evaluator as evaluator_module
    from fedpeft.models.weights import FORMED

    runtime = toy_moe_runtime
    spec = method("flame").spec(runtime, 3)
    runtime.install(ClientModel(lora=spec), seed=0)
    wrappers = [m for m in runtime.peft.modules() if isinstance(m, ParamWrapper)]
    with torch.no_grad():
        for wrapper in wrappers:
            wrapper.lora_B[spec.key].weight.normal_(std=0.5)  # a LoRA that changes the answers
    formed = []
    for proxy in (peft_layer._LoraFactorsProxy, peft_layer._LoraParameterProxy):
        original = proxy.forward
        monkeypatch.setattr(proxy, "forward", lambda self, *a, _f=original, **k: formed.append(1) or _f(self, *a, **k))
    examples = toy_moe_clients[0].test  # 6 prompts, one batch, 3 new tokens: the prompt's pass and 2 decoding steps

    once = runtime.evaluator.predict(examples)
    formed_once = len(formed)
    # Per adapted tensor for the whole prediction: one forming, and one by torch's register_parametrization, which
    # evaluates a parametrization to check its output (PEFT's per-pass path pays both at every pass).
    assert formed_once == 2 * len(wrappers)
    formed.clear()
    monkeypatch.setattr(evaluator_module, "parameter_adapters_formed", lambda model: contextlib.nullcontext())
    every_pass = runtime.evaluator.predict(examples)
    assert len(formed) == 3 * 2 * len(wrappers)  # PEFT alone: at the prompt's pass and at 2 decoding steps
    assert once == every_pass and any(once)

    for wrapper in wrappers:  # nothing left behind: no merged mark, no parametrization
        assert FORMED not in wrapper.merged_adapters and not wrapper.merged
        assert not torch.nn.utils.parametrize.is_parametrized(wrapper.get_base_layer())
    batch = runtime.encode(toy_moe_clients[0].train[:4])
    loss = runtime.peft(**batch).loss
    loss.backward()
    assert all(w.lora_B[spec.key].weight.grad is not None for w in wrappers)
