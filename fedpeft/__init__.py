"""fedpeft: personalized federated fine-tuning of LLMs with parameter-efficient adapters."""

__version__ = "0.1.0"
