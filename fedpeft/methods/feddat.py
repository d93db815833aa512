"""FedDAT: a dual-adapter teacher and mutual knowledge distillation.

H. Chen, Y. Zhang, D. Krompass, J. Gu, V. Tresp, "FedDAT: An Approach for Foundation Model Finetuning in
Multi-Modal Heterogeneous Federated Learning", AAAI 2024, https://arxiv.org/abs/2308.12305. A client holds three
adapters: the received global one (frozen), its own client-specific one, and a trainable copy of the global one.
The dual-adapter teacher (DAT) is base + frozen global + client-specific. Mutual distillation: the client-specific
adapter trains with the task loss plus KL(student || DAT) and the global copy with the task loss plus
KL(DAT || student) (temperature ``kd_temperature``, weight ``kd_weight``). The global copy is uploaded (FedAvg
within each architecture group); the client keeps the DAT. ``compute_scale`` 2.564 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

import torch

from fedpeft.adapters.hooked import HookedAdapter
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import ForwardOutputs
from fedpeft.methods.families.branched import BranchedLoraMethod
from fedpeft.methods.feddat_config import FedDATConfig
from fedpeft.models.runtime import ModelRuntime
from fedpeft.training import Batch, LossHook

TEACHER = ("frozen", "local")
STUDENT = ("global",)


def distillation(adapter: HookedAdapter, teacher: tuple[str, ...], weight: float, temperature: float) -> LossHook:
    """Extra loss: ``weight * T^2 * KL(p_teacher || p_model)`` on the labelled positions, the teacher being the
    same model with only the ``teacher`` branches active (no gradient)."""

    def term(model: torch.nn.Module, batch: Batch, outputs: ForwardOutputs) -> torch.Tensor:
        trained, was_training = adapter.active, model.training
        adapter.active = teacher
        model.eval()  # the teacher without dropout
        try:
            with torch.no_grad():
                target = model(**batch).logits
        finally:
            adapter.active = trained
            model.train(was_training)
        logits = outputs.logits
        if logits.dim() == 3:  # causal LM: position t predicts label t + 1, only where there is a label
            keep = batch["labels"][:, 1:] != -100
            logits, target = logits[:, :-1][keep], target[:, :-1][keep]
        log_p = torch.log_softmax(logits / temperature, -1)
        log_q = torch.log_softmax(target / temperature, -1)
        kl = torch.nn.functional.kl_div(log_p, log_q, log_target=True, reduction="batchmean")
        return weight * temperature**2 * kl

    return term


class FedDAT(BranchedLoraMethod[FedDATConfig]):
    """Frozen global + client-specific adapter (the teacher) and a global student, distilled both ways."""

    name = "feddat"
    trainings_per_round = 2
    Config = FedDATConfig
    branches = ("global", "frozen", "local")
    personal_view = TEACHER

    def client_adapter(
        self, runtime: ModelRuntime, shared: StateDict, client_state: dict[str, StateDict] | None
    ) -> HookedAdapter:
        adapter = super().client_adapter(runtime, shared, client_state)
        if shared:
            adapter.load_branch("frozen", shared)  # the teacher uses the global adapter as received
        return adapter

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        cfg = self.cfg
        adapter = self.client_adapter(runtime, payload.tensors, client_state)
        to_student = distillation(adapter, STUDENT, cfg.kd_weight, cfg.kd_temperature)
        metrics = self.train_branches(runtime, adapter, client.train, ("local",), TEACHER, seed, to_student)
        to_teacher = distillation(adapter, TEACHER, cfg.kd_weight, cfg.kd_temperature)
        student = self.train_branches(
            runtime, adapter, client.train, ("global",), STUDENT, derive_seed(seed, "student"), to_teacher
        )
        metrics = {**metrics, "student_loss": student["loss"]}
        return self.shared_update(client, adapter, metrics), self.client_state(adapter)
