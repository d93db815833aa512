"""The methods of a report's runs, and the calls of their reporting hooks.

The methods come from the runs' ``config.yaml`` (``methods``: entries with ``name`` and optional ``label``, the
label defaulting to the name) looked up in :data:`fedpeft.core.registry.METHODS`. A method's reporting hooks are
named by its registry declaration (:class:`~fedpeft.core.registry.Entry`'s ``report_sections`` and
``report_plots``): a shipped method's as ``module:function`` of :mod:`fedpeft.analysis`
(:mod:`fedpeft.catalog.methods`), imported here without the method, a plugin's as the function it registered with.
So the report never builds a method nor imports one, and a report of shipped methods imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, cast, overload

from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.registry import METHODS, Entry, Hook, imported
from fedpeft.report.records import CONFIG_FILE, Record, first_seen

HookName = Literal["report_sections", "report_plots"]
"""A reporting hook: ``report_sections(records, run_dirs)`` gives markdown blocks that ``summary.md`` prints after the
result tables; ``report_plots(records, run_dirs, out_dir)`` writes plot files into ``plots/`` and gives their paths.
``records`` are the ``results.jsonl`` records of the methods that declare the hook, ``run_dirs`` the report's runs."""

# The two hooks' signatures, as :data:`HookName` says.
SectionsHook = Callable[[Sequence[Record], Sequence[Path]], list[str]]
PlotsHook = Callable[[Sequence[Record], Sequence[Path], Path], list[Path]]

DECLARED: dict[HookName, Callable[[Entry], Hook | None]] = {
    "report_sections": lambda entry: entry.report_sections,
    "report_plots": lambda entry: entry.report_plots,
}
"""Each reporting hook as a method's registry entry declares it."""


def config_method_entries(run_dirs: Sequence[Path]) -> list[JSONObject]:
    """The ``methods`` entries of the runs' ``config.yaml``, in run and list order (a run without one gives none)."""
    import yaml

    entries = []
    for run_dir in run_dirs:
        config = Path(run_dir) / CONFIG_FILE
        if config.is_file():
            methods = (yaml.safe_load(config.read_text()) or {}).get("methods", [])
            entries += [dict(entry) for entry in methods if isinstance(entry, Mapping)]
    return entries


def method_names(run_dirs: Sequence[Path]) -> dict[str, str]:
    """``label -> method name`` of the runs' method entries (a later entry replaces an earlier one of its label)."""
    return {str(e.get("label") or e["name"]): str(e["name"]) for e in config_method_entries(run_dirs) if "name" in e}


@overload
def hook_function(name: str, hook: Literal["report_sections"]) -> SectionsHook | None: ...
@overload
def hook_function(name: str, hook: Literal["report_plots"]) -> PlotsHook | None: ...
def hook_function(name: str, hook: HookName) -> SectionsHook | PlotsHook | None:
    """The function the method ``name`` (or an alias) declares as ``hook``, imported from the module its declaration
    names (not the method's); ``None`` where it declares none or no method is registered as ``name``.

    Raises:
        LookupError: the declared hook does not exist.
    """
    if name not in METHODS:
        return None
    declared = DECLARED[hook](METHODS.entry(name))
    if declared is None or callable(declared):
        # The registry keeps any callable; a reporting hook has the signature its name documents (:data:`HookName`).
        return cast("SectionsHook | PlotsHook | None", declared)
    function = imported(declared)
    if not callable(function):
        raise LookupError(f"the method {name!r} declares the {hook} hook {declared}, which is no function")
    return function


@overload
def method_hook_calls(
    records: Sequence[Record], run_dirs: Sequence[Path], hook: Literal["report_sections"]
) -> list[tuple[SectionsHook, list[Record]]]: ...
@overload
def method_hook_calls(
    records: Sequence[Record], run_dirs: Sequence[Path], hook: Literal["report_plots"]
) -> list[tuple[PlotsHook, list[Record]]]: ...
def method_hook_calls(
    records: Sequence[Record], run_dirs: Sequence[Path], hook: HookName
) -> Sequence[tuple[SectionsHook | PlotsHook, list[Record]]]:
    """The calls a report makes of one reporting hook (``"report_sections"`` or ``"report_plots"``).

    One call per function declared as the hook among the methods in ``records``, with the records of every method
    that declares it: ``potara`` and ``fisher_merge`` (both declare the mixing-weight hooks) share one call, so one
    mixing-weight table. Methods without a known name (``base``, runs without ``config.yaml``, a method no longer
    registered) and methods that declare no such hook are left out.

    Returns:
        ``(hook, its records)`` pairs, in the first-seen order of the methods in ``records``; each hook takes the
        arguments of :data:`HookName`.
    """
    names = method_names(run_dirs)
    calls: dict[SectionsHook | PlotsHook, set[str]] = {}
    for label in first_seen(record["method"] for record in records):
        name = names.get(label)
        function = hook_function(name, hook) if name is not None else None
        if function is not None:
            calls.setdefault(function, set()).add(label)
    return [(function, [r for r in records if r["method"] in labels]) for function, labels in calls.items()]
