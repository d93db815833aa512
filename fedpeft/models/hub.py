"""Whether the Hugging Face hub can be asked for a checkpoint: offline mode, or one quick reachability probe.

Asked for a hub id that is not in the local cache, transformers retries the hub for about half a minute on a
machine without network before it gives up. Probing once first lets such a machine read the cache only: a cached
checkpoint still loads, and a missing one is refused at once, with the reason.
"""

from __future__ import annotations

import os
import threading

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
