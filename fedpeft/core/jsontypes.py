"""The types of JSON data: records, configs as dicts, measurements read back from files (no torch here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
"""Any value ``json.loads`` can return."""
JSONObject: TypeAlias = dict[str, JSONValue]
"""A JSON object: a record of results.jsonl or costs.jsonl, a measurement, a config as a dict."""
JSONMapping: TypeAlias = Mapping[str, JSONValue]
"""A JSON object only read."""
