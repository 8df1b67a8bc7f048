"""The schema side of Spark ingest: a new table's ``schemaString``, and sources against a table.

- A new table gets the Spark schema with every field, array element and map value nullable (as
  Delta-Spark writes ``schema.asNullable``); column names and types plain readers cannot take
  without table features are refused (``timestamp_ntz``, ``variant``, names with `` ,;{}()=``).
- A later source must bring the table's columns: they are selected in the table's order, integer
  and float widening is cast, anything else is refused naming every difference.
"""

from __future__ import annotations

import json
from typing import Any

from delta_mirror.errors import DataError

# Delta without column mapping refuses these characters in column names.
_INVALID_NAME_CHARS = " ,;{}()\n\t="
_PARTITION_TYPES = ("string", "byte", "short", "integer", "long", "date", "boolean")
_REFUSED_TYPES = ("timestamp_ntz", "variant", "void")
_WIDENING = {
    "byte": ("short", "integer", "long"),
    "short": ("integer", "long"),
    "integer": ("long", "double"),
    "float": ("double",),
}


def plain_schema(schema: Any) -> Any:
    """A schema without nullability (every field is nullable in the table)."""
    if isinstance(schema, dict):
        return {k: plain_schema(v) for k, v in schema.items() if k not in ("nullable", "containsNull")}
    if isinstance(schema, list):
        return [plain_schema(v) for v in schema]
    return schema


def _nullable(schema: Any) -> Any:
    """Every field, array element and map value nullable (Delta-Spark writes ``schema.asNullable``)."""
    if isinstance(schema, dict):
        out = {k: _nullable(v) for k, v in schema.items()}
        for key in ("nullable", "containsNull", "valueContainsNull"):
            if key in out:
                out[key] = True
        return out
    if isinstance(schema, list):
        return [_nullable(v) for v in schema]
    return schema


def new_table_schema(df: Any, partitions: list[str], table: str) -> str:
    """The ``schemaString`` of a new table from the DataFrame, refusing what plain readers cannot read."""
    schema = _nullable(df.schema.jsonValue())
    names = [f["name"] for f in schema["fields"]]
    text = json.dumps(schema)
    for name in names:
        bad = [c for c in name if c in _INVALID_NAME_CHARS]
        if bad or not name:
            raise DataError(
                f"column name {name!r} has characters Delta refuses without column mapping ({bad!r})",
                table=table,
                hint="rename the column (e.g. withColumnRenamed, or a CSV header without spaces)",
            )
    for kind in _REFUSED_TYPES:
        if f'"{kind}"' in text:
            raise DataError(
                f"column type {kind} needs a table feature this pipeline does not enable",
                table=table,
                hint="cast the column (e.g. timestamp_ntz to timestamp)",
            )
    types = {f["name"]: f["type"] for f in schema["fields"]}
    for col in partitions:
        if col not in types:
            raise DataError(f"partition column {col!r} is not in the data ({names})", table=table)
        if types[col] not in _PARTITION_TYPES:
            raise DataError(
                f"partition column {col!r} has type {types[col]}",
                table=table,
                hint=f"partition by a column of type {', '.join(_PARTITION_TYPES)}",
            )
    if partitions and len(partitions) == len(names):
        raise DataError("every column is a partition column", table=table, hint="keep a data column")
    return json.dumps(schema, separators=(",", ":"))


def conform(df: Any, table_schema: dict[str, Any], table: str) -> Any:
    """The DataFrame with the table's columns in the table's order; widening casts, else refused."""
    from pyspark.sql import functions as F

    source = {f["name"]: f["type"] for f in df.schema.jsonValue()["fields"]}
    wanted = [(f["name"], f["type"]) for f in table_schema["fields"]]
    missing = [n for n, _ in wanted if n not in source]
    extra = [n for n in source if n not in {n for n, _ in wanted}]
    problems = []
    if missing:
        problems.append(f"missing column(s) {missing}")
    if extra:
        problems.append(f"unknown column(s) {extra}")
    cols = []
    for name, kind in wanted:
        if name not in source:
            continue
        have = source[name]
        if plain_schema(have) == plain_schema(kind):
            cols.append(F.col(f"`{name}`"))
        elif isinstance(have, str) and isinstance(kind, str) and kind in _WIDENING.get(have, ()):
            cols.append(F.col(f"`{name}`").cast(kind).alias(name))
        else:
            problems.append(f"column {name!r} is {json.dumps(have)}, the table has {json.dumps(kind)}")
    if problems:
        raise DataError(
            "the source does not match the table's schema: " + "; ".join(problems),
            table=table,
            hint="pass the table's schema to read the source (schema=/--schema) or fix the source",
        )
    return df.select(*cols)


__all__ = ["conform", "new_table_schema", "plain_schema"]
