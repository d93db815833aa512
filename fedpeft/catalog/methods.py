"""The methods fedpeft ships, declared in :data:`~fedpeft.core.registry.METHODS` without importing any of them.

One declaration per method says all the registry knows of it before importing it: its name, its class
(``fedpeft.methods.<name>:<Class>``, imported on first use), a one-line description, its aliases, its config class
(``fedpeft.methods.<name>_config:<Config>``, importable without torch, so a config is validated before torch is
imported) and its reporting hooks (functions of :mod:`fedpeft.analysis`, which imports no torch, so a report calls
them without importing the method). tests/test_cli_fast.py checks each against the class it names.
"""

from fedpeft.core.registry import METHODS

_MIXING_SECTIONS = "fedpeft.analysis.mixing:mixing_report_sections"
_MIXING_PLOTS = "fedpeft.analysis.mixing:mixing_report_plots"
_RANK_SCALE_PLOTS = "fedpeft.analysis.scale_plots:rank_scale_plots"

METHODS.declare(
    "adalora",
    "fedpeft.methods.adalora:AdaLoraBaseline",
    "AdaLoRA (PEFT's): each client alone, its total rank shrinking adaptively to the budget; no federation",
    config="fedpeft.methods.adalora_config:AdaLoraBaselineConfig",
)
METHODS.declare(
    "bayestune_lora",
    "fedpeft.methods.bayestune_lora:BayesTuneLora",
    "BayesTune-LoRA: each client learns its own LoRA rank structure, pruned to every budget; no federation",
    aliases=("bayestune",),
    config="fedpeft.methods.bayestune_lora_config:BayesTuneLoraConfig",
    report_plots=_RANK_SCALE_PLOTS,
)
METHODS.declare(
    "dept_spec",
    "fedpeft.methods.dept_spec:DeptSpec",
    "DEPT(SPEC): FedAvg of every weight but the token and position embeddings, which each client keeps",
    aliases=("dept",),
    config="fedpeft.methods.dept_spec_config:DeptSpecConfig",
)
METHODS.declare(
    "ditto",
    "fedpeft.methods.ditto:Ditto",
    "Ditto: a global LoRA by FedAvg and a personal LoRA pulled toward it by a proximal term",
    config="fedpeft.methods.ditto_config:DittoConfig",
)
METHODS.declare(
    "fedalt",
    "fedpeft.methods.fedalt:FedALT",
    "FedALT: an individual LoRA trained beside a frozen rest-of-world LoRA, mixed per input",
    config="fedpeft.methods.fedalt_config:FedALTConfig",
)
METHODS.declare(
    "fedavg_full",
    "fedpeft.methods.fedavg_full:FedAvgFull",
    "FedAvg of all weights (full fine-tuning, Standard FL); also a federated base-model stage",
    config="fedpeft.methods.fedavg_full_config:FedAvgFullConfig",
)
METHODS.declare(
    "feddat",
    "fedpeft.methods.feddat:FedDAT",
    "FedDAT: a dual-adapter teacher (frozen global + client adapter) and mutual distillation",
    config="fedpeft.methods.feddat_config:FedDATConfig",
)
METHODS.declare(
    "feddpa",
    "fedpeft.methods.feddpa:FedDPA",
    "FedDPA-T: a federated global LoRA and a kept local LoRA, mixed per test instance",
    aliases=("feddpa_t",),
    config="fedpeft.methods.feddpa_config:FedDPAConfig",
)
METHODS.declare(
    "fedex_lora",
    "fedpeft.methods.fedex_lora:FedExLora",
    "FedEX-LoRA: FedAvg of A and B plus the residual folded into the frozen weights (exact aggregation)",
    config="fedpeft.methods.fedex_lora_config:FedExLoraConfig",
)
METHODS.declare(
    "fedit",
    "fedpeft.methods.fedit:FedIT",
    "FedIT: FedAvg of the LoRA factors A and B (and the task head), weighted by data size",
    aliases=("fedavg",),
    config="fedpeft.methods.fedit_config:FedITConfig",
)
METHODS.declare(
    "fedit_merged",
    "fedpeft.methods.fedit_merged:FedITMerged",
    "Standard FL with LoRA: FedIT on q and v with a cosine learning rate, merged into the weights",
    aliases=("standard_fl_lora",),
    config="fedpeft.methods.fedit_merged_config:FedITMergedConfig",
)
METHODS.declare(
    "fedl2p",
    "fedpeft.methods.fedl2p:FedL2P",
    "FedL2P: a federated MLP maps client statistics to per-LoRA-module learning rates",
    config="fedpeft.methods.fedl2p_config:FedL2PConfig",
)
METHODS.declare(
    "fedmkt",
    "fedpeft.methods.fedmkt:FedMKT",
    "FedMKT: FedAvg per architecture and min-loss mutual distillation across architectures on public data",
    config="fedpeft.methods.fedmkt_config:FedMKTConfig",
)
METHODS.declare(
    "fedmosaic",
    "fedpeft.methods.fedmosaic:FedMosaic",
    "FedMosaic: relevance-guided aggregation (RELA) of PQ-LoRA adapters across heterogeneous clients",
    config="fedpeft.methods.fedmosaic_config:FedMosaicConfig",
)
METHODS.declare(
    "fedp2eft",
    "fedpeft.methods.fedp2eft:FedP2EFT",
    "FedP2EFT: a federated PSG gives every client its LoRA rank structure for every budget",
    config="fedpeft.methods.fedp2eft_config:FedP2EFTConfig",
    report_plots=_RANK_SCALE_PLOTS,
)
METHODS.declare(
    "fedprox",
    "fedpeft.methods.fedprox:FedProx",
    "FedProx: FedIT plus a proximal term pulling the local adapter toward the global one",
    config="fedpeft.methods.fedprox_config:FedProxConfig",
)
METHODS.declare(
    "fedsa_lora",
    "fedpeft.methods.fedsa_lora:FedSALora",
    "FedSA-LoRA: the A matrices are averaged, every client keeps its own B",
    config="fedpeft.methods.fedsa_lora_config:FedSALoraConfig",
)
METHODS.declare(
    "fedsim",
    "fedpeft.methods.fedsim:FedSim",
    "FedSim: a shared (averaged) and a personal LoRA, summed and trained together",
    config="fedpeft.methods.fedsim_config:FedSimConfig",
)
METHODS.declare(
    "fedsvd",
    "fedpeft.methods.fedsvd:FedSvd",
    "FedSVD: clients train B only; the server averages B and re-factorizes B A by SVD (new A)",
    config="fedpeft.methods.fedsvd_config:FedSvdConfig",
)
METHODS.declare(
    "ffa_lora",
    "fedpeft.methods.ffa_lora:FFALora",
    "FFA-LoRA: A frozen at the shared random initialization; only B (and the head) trained and averaged",
    config="fedpeft.methods.ffa_lora_config:FFALoraConfig",
)
METHODS.declare(
    "fisher_merge",
    "fedpeft.methods.fisher_merge:FisherMerge",
    "Fisher merging: FedIT and a local LoRA merged per coordinate with diagonal Fisher weights",
    config="fedpeft.settings.methods:FederatedLocalConfig",
    report_sections=_MIXING_SECTIONS,
    report_plots=_MIXING_PLOTS,
)
METHODS.declare(
    "flame",
    "fedpeft.methods.flame:Flame",
    "FLAME: federated LoRA on a sparse MoE, each tier at its top-k, rescaled, activation-aware averaging",
    config="fedpeft.methods.flame_config:FlameConfig",
)
METHODS.declare(
    "flexlora",
    "fedpeft.methods.flexlora:FlexLora",
    "FlexLoRA: heterogeneous ranks by SVD truncation of the averaged full-size update",
    config="fedpeft.methods.flexlora_config:FlexLoraConfig",
)
METHODS.declare(
    "flora",
    "fedpeft.methods.flora:Flora",
    "FLoRA: stacking of heterogeneous-rank LoRA factors, folded into the base weights every round",
    config="fedpeft.methods.flora_config:FloraConfig",
)
METHODS.declare(
    "guided",
    "fedpeft.methods.guided:Guided",
    "Aggregation to guidance: merge operators on the server, guidance (hard init, l2, kd) on clients",
    config="fedpeft.methods.guided_config:GuidedConfig",
)
METHODS.declare(
    "hetlora",
    "fedpeft.methods.hetlora:HetLora",
    "HetLoRA: heterogeneous ranks by truncation, zero-padding and norm-weighted averaging",
    config="fedpeft.methods.hetlora_config:HetLoraConfig",
)
METHODS.declare(
    "local",
    "fedpeft.methods.local:Local",
    "Local: each client trains a fixed-rank LoRA alone, as many steps as a federated run; no communication",
    aliases=("sft",),
    config="fedpeft.methods.local_config:LocalConfig",
)
METHODS.declare(
    "lora",
    "fedpeft.methods.lora:LoraBaseline",
    "LoRA baseline: each client alone fine-tunes a LoRA of rank = budget; no federation",
    config="fedpeft.methods.lora_config:LoraBaselineConfig",
)
METHODS.declare(
    "perada",
    "fedpeft.methods.perada:PerAda",
    "PerAda: personal adapters regularized toward a global adapter improved by distillation",
    config="fedpeft.methods.perada_config:PerAdaConfig",
)
METHODS.declare(
    "potara",
    "fedpeft.methods.potara:Potara",
    "Potara: FedIT and a local LoRA from the same init, merged per client with closed-form weights",
    config="fedpeft.methods.potara_config:PotaraConfig",
    report_sections=_MIXING_SECTIONS,
    report_plots=_MIXING_PLOTS,
)
METHODS.declare(
    "rolora",
    "fedpeft.methods.rolora:RoLora",
    "RoLoRA: alternating rounds train and average only B, then only A (exact aggregation)",
    config="fedpeft.methods.rolora_config:RoLoraConfig",
)
METHODS.declare(
    "sft_rounds",
    "fedpeft.methods.sft_rounds:SftRounds",
    "SFT in rounds: every client trains its own LoRA on its task stream, round by round; shares nothing",
    config="fedpeft.methods.sft_rounds_config:SftRoundsConfig",
)
METHODS.declare(
    "takfl",
    "fedpeft.methods.takfl:TAKFL",
    "TAKFL: each architecture group's knowledge distilled separately and merged by task arithmetic",
    config="fedpeft.methods.takfl_config:TAKFLConfig",
)
METHODS.declare(
    "trivial_lora",
    "fedpeft.methods.trivial_lora:TrivialLora",
    "Trivial LoRA: FedAvg of one small LoRA that every compute tier can afford",
    config="fedpeft.methods.trivial_lora_config:TrivialLoraConfig",
)
