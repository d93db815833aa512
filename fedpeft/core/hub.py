"""Whether the Hugging Face hub can be asked for a checkpoint: offline mode, or one quick reachability probe.

Asked for a hub id that is not in the local cache, transformers retries the hub for about half a minute on a
machine without network before it gives up. Probing once first lets such a machine read the cache only: a cached
checkpoint still loads, and a missing one is refused at once, with the reason. The config's check
(:func:`check_model_name`) does so before torch is imported, so the refusal comes within a second or two.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from huggingface_hub import constants, get_session

# The environment variables that switch the hub off (huggingface_hub reads them once, at import).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
PROBE_SECONDS = 2.0  # how long the probe waits for the hub's answer, name resolution included


def offline_reason() -> str | None:
    """Why the hub is not to be asked, as the end of a sentence; ``None`` when it answers.

    Returns:
        ``"HF_HUB_OFFLINE is set"`` (or ``TRANSFORMERS_OFFLINE``), ``"the hub (<endpoint>) cannot be reached"``
        when one request to it gets no answer within :data:`PROBE_SECONDS`, or ``None``.
    """
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{name} is set"
    if constants.HF_HUB_OFFLINE:  # set in the environment before huggingface_hub was imported
        return "HF_HUB_OFFLINE is set"
    if not hub_answers(constants.ENDPOINT):
        return f"the hub ({constants.ENDPOINT}) cannot be reached"
    return None


def hub_answers(endpoint: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether one HEAD request to ``endpoint`` gets an answer (any HTTP status) within ``timeout`` seconds.

    The request goes through huggingface_hub's HTTP session (its proxies and headers), once, without retries; it
    runs in a daemon thread, because no socket timeout bounds a name lookup that hangs.
    """
    answered = threading.Event()

    def ask() -> None:
        try:
            get_session().head(endpoint, timeout=timeout)
        except Exception:  # no answer, whatever the reason (no route, no name, refused, timed out, bad URL)
            return
        answered.set()

    probe = threading.Thread(target=ask, name="hub-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    return answered.is_set()


def unknown_model_sentence(name: str, revision: str | None, offline: str | None) -> str:
    """The sentence refusing a model ``name`` that nothing can load: not registered, no local path, not in the
    hub cache (and, when ``offline`` says why, the hub not to be asked)."""
    from fedpeft.core.registry import MODELS

    at = f" (revision {revision})" if revision else ""
    why = f", and {offline}" if offline else ""
    return (
        f"Model {name}{at} is neither a registered name nor a local path nor in the Hugging Face cache{why}; "
        f"choose one of {', '.join(MODELS.names())}, give a local checkpoint directory, or download it first "
        "with `huggingface-cli download` on a machine with internet access."
    )


def in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    """Whether the local hub cache holds ``repo_id``'s ``config.json`` (at ``revision``); a name that is no valid
    hub id is not there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # not a valid repo id (a path, say)
        return False
    return isinstance(found, str)


def check_model_name(name: str, revision: str | None = None) -> None:
    """Refuse, with :func:`unknown_model_sentence`, a model name that is not registered, no local path (or
    ``.gguf`` file) and not in the hub cache, when the hub is not to be asked (:func:`offline_reason`): nothing
    could load it. Imports no torch, so a run stops at once instead of after the libraries have loaded."""
    from fedpeft.core.errors import UserError
    from fedpeft.core.registry import MODELS

    if name in MODELS or Path(name).expanduser().exists() or name.endswith(".gguf") or in_hub_cache(name, revision):
        return
    offline = offline_reason()
    if offline is not None:
        raise UserError(unknown_model_sentence(name, revision, offline))


def check_raw_model(raw: dict[str, object]) -> None:
    """:func:`check_model_name` on the ``model`` of a config as read (before validation, which imports torch)."""
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("name"), str):
        revision = model.get("revision")
        check_model_name(model["name"], revision if isinstance(revision, str) else None)


@contextlib.contextmanager
def hub_switched_off() -> Iterator[None]:
    """huggingface_hub's offline mode for the block: every look-up, also those that take no ``local_files_only``,
    reads the local cache only."""
    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before
