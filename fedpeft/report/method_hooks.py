"""Which method class wrote a report's records, and the calls of its reporting hooks.

The classes come from the runs' ``config.yaml`` (``methods``: entries with ``name`` and optional ``label``, the
label defaulting to the name) looked up in :data:`fedpeft.core.registry.METHODS`. The report never builds a
method: it calls the class's reporting classmethods (``Method.report_sections``, ``Method.report_plots``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpeft.core.errors import UserError
from fedpeft.report.records import Record, first_seen

if TYPE_CHECKING:
    from fedpeft.methods.base import Method

CONFIG_FILE = "config.yaml"


def config_method_entries(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """The ``methods`` entries of the runs' ``config.yaml``, in run and list order (a run without one gives none)."""
    import yaml

    entries = []
    for run_dir in run_dirs:
        config = Path(run_dir) / CONFIG_FILE
        if config.is_file():
            methods = (yaml.safe_load(config.read_text()) or {}).get("methods", [])
            entries += [dict(entry) for entry in methods if isinstance(entry, Mapping)]
    return entries


def method_class(name: Any) -> type[Method] | None:
    """The registered method class of ``name`` (or of an alias); ``None`` for a name that is not registered."""
    import fedpeft.methods  # noqa: F401  (registers the methods)
    from fedpeft.methods.base import method_class as registered_class

    try:
        return registered_class(str(name))
    except UserError:
        return None


def method_classes(run_dirs: Sequence[Path]) -> dict[str, type[Method]]:
    """``label -> method class`` of the runs' method entries with a registered name (others are skipped).

    A later entry replaces an earlier one of the same label, as a later run's records replace an earlier run's.
    """
    classes: dict[str, type[Method]] = {}
    for entry in config_method_entries(run_dirs):
        cls = method_class(entry.get("name"))
        if cls is not None:
            classes[str(entry.get("label") or entry["name"])] = cls
    return classes


def method_hook_calls(
    records: Sequence[Record], run_dirs: Sequence[Path], hook: str
) -> list[tuple[Callable[..., Any], list[Record]]]:
    """The calls a report makes of one reporting hook (``"report_sections"`` or ``"report_plots"``).

    One call per implementation of the hook among the classes of the methods in ``records``, with the records of
    every method whose class has that implementation: ``potara`` and ``fisher_merge`` (which inherits Potara's
    hooks) share one call, so one mixing-weight table. Methods without a known class (``base``, runs without
    ``config.yaml``, a method no longer registered) are left out.

    Returns:
        ``(hook of the class, its records)`` pairs, in the first-seen order of the methods in ``records``.
    """
    classes = method_classes(run_dirs)
    calls: dict[Any, tuple[Callable[..., Any], set[str]]] = {}
    for label in first_seen(record["method"] for record in records):
        cls = classes.get(label)
        if cls is not None:
            bound = getattr(cls, hook)
            calls.setdefault(bound.__func__, (bound, set()))[1].add(label)
    return [(bound, [r for r in records if r["method"] in labels]) for bound, labels in calls.values()]
