"""FedALT: an individual LoRA trained locally beside a frozen rest-of-world LoRA, mixed per input.

J. Bian, L. Wang, L. Zhang, J. Xu, "FedALT: Federated Fine-Tuning through Adaptive Local Training with
Rest-of-World LoRA", AAAI 2026, https://arxiv.org/abs/2503.11880.

Every client keeps training its own individual LoRA from round to round (it is never replaced by an aggregate).
Each round the server sends it the rest-of-world (RoW) LoRA: the data-size-weighted mean of the other clients'
latest individual LoRAs. The client trains its individual LoRA and a small mixer with the RoW LoRA frozen, then
uploads the individual LoRA. At every LoRA layer the mixer maps the layer's input x (per token) to two softmax
weights, and the layer computes W x + g_ind(x) * B_i A_i x + g_row(x) * B_row A_row x (both scaled by
alpha / r). The mixer starts at zero (weights 1/2, 1/2); the task head of classification models is individual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from peft.tuners.lora import LoraLayer

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.methods.families.lora_keys import is_lora, only, target_spec
from fedpeft.methods.fedalt_config import FedALTConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


def rest_of_world(individuals: dict[str, tuple[float, StateDict]], client_id: str) -> StateDict:
    """Weighted mean of every stored individual LoRA except ``client_id``'s (all of them when it is alone)."""
    others = [v for cid, v in individuals.items() if cid != client_id] or list(individuals.values())
    total = sum(w for w, _ in others)
    keys = others[0][1]
    zero = torch.zeros((), dtype=torch.float64)
    return {k: sum((w * t[k].double() for w, t in others), zero).div(total).to(keys[k].dtype) for k in keys}


class Mixer(torch.nn.Module):
    """One linear gate (input features -> 2 logits) per LoRA layer, zero-initialized."""

    def __init__(self, layers: dict[str, int]) -> None:
        super().__init__()
        gates = {name.replace(".", "/"): torch.nn.Linear(d, 2) for name, d in layers.items()}
        for gate in gates.values():
            torch.nn.init.zeros_(gate.weight)
            torch.nn.init.zeros_(gate.bias)
        self.gates = torch.nn.ModuleDict(gates)

    def weights(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.gates[name.replace(".", "/")](x), dim=-1)


def _lora_layers(runtime: ModelRuntime) -> dict[str, LoraLayer]:
    name = runtime.active.key  # type: ignore[union-attr]
    return {n: m for n, m in runtime.peft.named_modules() if isinstance(m, LoraLayer) and name in m.lora_A}  # type: ignore[union-attr]


@dataclass
class Mixture:
    """The :class:`~fedpeft.models.runtime.Extension` that adds the gated RoW LoRA and gates the individual one
    at every LoRA layer of the active adapter."""

    row: StateDict
    mixer: Mixer

    def attach(self, runtime: ModelRuntime) -> Callable[[], None]:
        row, mixer = self.row, self.mixer
        adapter = runtime.active.key  # type: ignore[union-attr]
        handles = []
        for name, layer in _lora_layers(runtime).items():
            assert isinstance(layer, torch.nn.Module)  # PEFT's LoRA layers are modules with the LoraLayer mixin
            a_row = row[f"{name}.lora_A.weight"].to(runtime.device)
            b_row = row[f"{name}.lora_B.weight"].to(runtime.device)
            gates: dict[str, torch.Tensor] = {}

            def gate(module, args, name=name, gates=gates):  # noqa: ANN001, ANN202
                gates["w"] = mixer.weights(name, args[0])

            def scale_individual(module, args, output, gates=gates):  # noqa: ANN001, ANN202
                return output * gates["w"][..., :1]

            def add_row(module, args, output, layer=layer, a=a_row, b=b_row, gates=gates):  # noqa: ANN001, ANN202
                x = layer.lora_dropout[adapter](args[0])
                return output + gates["w"][..., 1:] * ((x @ a.T) @ b.T) * layer.scaling[adapter]

            handles.append(layer.register_forward_pre_hook(gate))
            handles.append(layer.lora_B[adapter].register_forward_hook(scale_individual))
            handles.append(layer.register_forward_hook(add_row))

        def detach() -> None:
            for handle in handles:
                handle.remove()

        return detach


def mixture(row: StateDict, mixer: Mixer) -> Mixture:
    """The ``ClientModel.extension`` that mixes the individual LoRA with the frozen RoW LoRA ``row``."""
    return Mixture(row, mixer)


@dataclass
class FedALTState(ServerState):
    """The seed of the shared LoRA initialization, and every client's latest individual LoRA with its weight
    (``tensors``: the rest-of-world LoRA of a client outside the federation, the mean of them all)."""

    init_seed: int = 0
    individual: dict[str, tuple[float, StateDict]] = field(default_factory=dict)


class FedALT(Method[FedALTConfig, FedALTState, dict[str, StateDict]]):
    """Individual LoRA + frozen rest-of-world LoRA, combined by a learned per-input mixer."""

    name = "fedalt"
    Config = FedALTConfig
    private_keys = ("classifier", "score", "pooler", "gates")
    mergeable = False  # a mixer gates the individual and rest-of-world LoRA per input

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return target_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedALTState:
        init_seed = derive_seed(seed, self.name, "init")
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=init_seed)
        tensors = only(runtime.adapter_state(), is_lora)
        return FedALTState(tensors=tensors, init_seed=init_seed)

    def payload(self, state: FedALTState, client_id: str) -> Payload:
        individuals = state.individual
        row = rest_of_world(individuals, client_id) if individuals else state.tensors
        return Payload(tensors=row, config={"init_seed": state.init_seed})

    def _new_mixer(self, runtime: ModelRuntime, saved: StateDict | None) -> Mixer:
        layers: dict[str, int] = {}
        for n, layer in _lora_layers(runtime).items():
            assert layer.in_features is not None  # set from the wrapped linear layer
            layers[n] = layer.in_features
        mixer = Mixer(layers).to(runtime.device)
        if saved:
            mixer.load_state_dict(saved)
        return mixer

    def _train(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        row: StateDict,
        saved: dict[str, StateDict] | None,
        init_seed: int,
        seed: int,
        steps: int | None,
    ) -> tuple[StateDict, StateDict, Metrics]:
        """Train the individual LoRA and the mixer beside the frozen RoW LoRA ``row`` (``steps``: ``None`` for
        the configured local training)."""
        cfg = self.cfg
        spec = self.spec(runtime)
        runtime.install(ClientModel(lora=spec, adapter=(saved or {}).get("individual", {})), seed=init_seed)
        mixer = self._new_mixer(runtime, (saved or {}).get("mixer"))
        runtime.install(ClientModel(lora=spec, adapter=runtime.adapter_state(), extension=mixture(row, mixer)))
        mixer_group = {"params": list(mixer.parameters()), "lr": cfg.mixer_lr or cfg.lr}
        metrics = runtime.train(client.train, local_training(cfg, seed, steps=steps, optimizer_groups=[mixer_group]))
        mixer_state = {k: v.detach().clone() for k, v in mixer.state_dict().items()}
        return runtime.adapter_state(), mixer_state, metrics

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        individual, mixer, metrics = self._train(
            runtime, client, payload.tensors, client_state, payload.config["init_seed"], seed, None
        )
        update = ClientUpdate(client.client_id, only(individual, is_lora), float(len(client.train)), metrics)
        return update, {"individual": individual, "mixer": mixer}

    def aggregate(self, state: FedALTState, updates: Iterable[ClientUpdate]) -> tuple[FedALTState, Metrics]:
        individuals = dict(state.individual)
        losses = []
        for update in updates:
            individuals[update.client_id] = (float(update.weight), update.tensors)
            losses.append(update.metrics.get("loss", 0.0))
        metrics = {"clients": float(len(losses))}
        if not losses:
            return state, metrics
        metrics["train_loss"] = sum(losses) / len(losses)
        tensors = rest_of_world(individuals, "")
        return dataclasses.replace(state, tensors=tensors, individual=individuals), metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedALTState,
        client_state: dict[str, StateDict] | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        init_seed = state.init_seed
        row = self.payload(state, client.client_id).tensors
        saved = client_state
        if saved is None:
            # A client that never took part (unseen) trains its individual LoRA and mixer here.
            individual, mixer_state, _ = self._train(runtime, client, row, None, init_seed, seed, self.cfg.unseen_steps)
            saved = {"individual": individual, "mixer": mixer_state}
        spec = self.spec(runtime)
        runtime.install(ClientModel(lora=spec), seed=init_seed)
        mixer = self._new_mixer(runtime, saved["mixer"])
        return ClientModel(lora=spec, adapter=saved["individual"], extension=mixture(row, mixer))
