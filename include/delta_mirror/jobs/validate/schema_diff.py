"""Compare two Delta schemas the way a reader cares about (used by every reader check)."""

from __future__ import annotations

import json
from typing import Any


def type_text(typ: Any) -> str:
    return typ.replace(" ", "").lower() if isinstance(typ, str) else json.dumps(typ)


_METADATA_KEYS = ("delta.columnMapping.id", "delta.columnMapping.physicalName")


def schema_diffs(expected: Any, found: Any, where: str) -> list[str]:
    """Differences that matter to a reader: names, types, nullability, column-mapping metadata.

    Other field metadata (comments, identity high-water marks...) and the spelling of primitive
    types (``decimal(10, 2)``) are not compared.
    """
    label = where or "(root)"
    if isinstance(expected, str) or isinstance(found, str):
        if type_text(expected) != type_text(found):
            return [f"{label}: type {type_text(expected)} vs {type_text(found)}"]
        return []
    if not isinstance(expected, dict) or not isinstance(found, dict):
        return [f"{label}: {expected!r} vs {found!r}"]
    kind = expected.get("type")
    if kind != found.get("type"):
        return [f"{label}: type {kind} vs {found.get('type')}"]
    if kind == "struct":
        return _struct_diffs(expected, found, where)
    if kind == "array":
        return _array_diffs(expected, found, where)
    if kind == "map":
        return _map_diffs(expected, found, where)
    return []


def _struct_diffs(expected: dict[str, Any], found: dict[str, Any], where: str) -> list[str]:
    """Fields: extra or missing ones, their order, then each field's own differences."""
    label = where or "(root)"
    out: list[str] = []
    e_fields = expected.get("fields") or []
    f_fields = {f.get("name"): f for f in found.get("fields") or []}
    names = [f.get("name") for f in e_fields]
    extra = [n for n in f_fields if n not in names]
    if extra:
        out.append(f"{label}: deltalake has extra fields {extra}")
    if [n for n in f_fields if n in names] != [n for n in names if n in f_fields]:
        out.append(f"{label}: field order {names} vs {list(f_fields)}")
    for ef in e_fields:
        name = ef.get("name")
        path = f"{where}.{name}" if where else str(name)
        ff = f_fields.get(name)
        if ff is None:
            out.append(f"{path}: missing in deltalake")
        else:
            out.extend(_field_diffs(ef, ff, path))
    return out


def _field_diffs(ef: dict[str, Any], ff: dict[str, Any], path: str) -> list[str]:
    """One struct field: nullability, column-mapping metadata, then its type."""
    out: list[str] = []
    if bool(ef.get("nullable", True)) != bool(ff.get("nullable", True)):
        out.append(f"{path}: nullable {ef.get('nullable')} vs {ff.get('nullable')}")
    e_meta, f_meta = ef.get("metadata") or {}, ff.get("metadata") or {}
    for key in _METADATA_KEYS:
        if key in e_meta and str(e_meta.get(key)) != str(f_meta.get(key)):
            out.append(f"{path}: metadata {key} {e_meta.get(key)!r} vs {f_meta.get(key)!r}")
    out.extend(schema_diffs(ef.get("type"), ff.get("type"), path))
    return out


def _null_flag_diffs(expected: dict[str, Any], found: dict[str, Any], key: str, where: str) -> list[str]:
    """An array's ``containsNull`` or a map's ``valueContainsNull`` (true when absent), if they differ."""
    if bool(expected.get(key, True)) == bool(found.get(key, True)):
        return []
    return [f"{where or '(root)'}: {key} {expected.get(key)} vs {found.get(key)}"]


def _array_diffs(expected: dict[str, Any], found: dict[str, Any], where: str) -> list[str]:
    out = _null_flag_diffs(expected, found, "containsNull", where)
    out.extend(schema_diffs(expected.get("elementType"), found.get("elementType"), f"{where}[]"))
    return out


def _map_diffs(expected: dict[str, Any], found: dict[str, Any], where: str) -> list[str]:
    out = _null_flag_diffs(expected, found, "valueContainsNull", where)
    out.extend(schema_diffs(expected.get("keyType"), found.get("keyType"), f"{where}.key"))
    out.extend(schema_diffs(expected.get("valueType"), found.get("valueType"), f"{where}.value"))
    return out


__all__ = ["schema_diffs", "type_text"]
