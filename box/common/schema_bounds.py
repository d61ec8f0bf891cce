"""Bounds on structured output, sent the way each model server takes them (issue 38).

A grammar-constrained server (llama.cpp, Ollama, LM Studio, vLLM) decodes only what the schema allows: an
array or a string without a bound lets a small model repeat one phrase until the output cap, and the cut-off
answer is not JSON. So every schema the box sends writes its bounds out — ``maxLength`` on each string,
``maxItems`` on each array — and ``fit_schema`` sends each server the bound keywords it takes and drops the
ones it would refuse. Pure: plain dicts in, a new dict out (the input is never changed); deterministic, so
the schema an imp sends stays byte-stable from call to call (the prompt cache, ENV-20).

What each server takes (the ``SchemaDialect`` of its profile, ``box.common.model_profiles``):

* **OpenAI, strict** — the Structured Outputs guide's "Supported properties": for strings ``pattern`` and
  ``format``; for numbers ``multipleOf``, ``maximum``, ``exclusiveMaximum``, ``minimum``,
  ``exclusiveMinimum``; for arrays ``minItems`` and ``maxItems``. ``minLength`` / ``maxLength`` are not in
  that list and are refused with HTTP 400 ("In context=(...), 'maxLength' is not permitted."), so strings are
  bounded there by the output cap and the reader, never by the schema. Fine-tuned models take none of the
  bound keywords ("When using fine-tuned models, additional constraints are unsupported": strings, numbers
  and arrays alike).
* **llama.cpp** (``tools/server`` → ``common/json-schema-to-grammar.cpp``) — ``maxLength`` / ``minLength``
  and ``minItems`` / ``maxItems`` become repetition bounds in the grammar. But a type *list*
  (``"type": ["string", "null"]``) is turned into a union of bare ``{"type": …}`` schemas: every other
  keyword of that node — a string's ``maxLength``, an object's ``properties`` — is lost, so a nullable object
  decodes as *any* object. For this converter a nullable value is sent as ``anyOf`` of the bounded value and
  ``{"type": "null"}``, which it keeps whole.
* **Ollama** and **LM Studio** hand the schema to the same llama.cpp converter (GGUF models): the same
  dialect. **vLLM**'s guided decoding (xgrammar / outlines) takes ``maxLength`` and ``maxItems`` and type
  lists.
* **compatible** (any other OpenAI-compatible service): OpenAI's strict subset, the one every such service
  that checks schemas is held to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

STRING_BOUNDS: Final = frozenset({"minLength", "maxLength"})
ARRAY_BOUNDS: Final = frozenset({"minItems", "maxItems"})


@dataclass(frozen=True)
class SchemaDialect:
    """Which bound keywords a server's structured output takes, and how it reads a nullable value."""

    string_bounds: bool  # minLength / maxLength (OpenAI strict: refused)
    array_bounds: bool  # minItems / maxItems
    type_lists: bool  # "type": [X, "null"] keeps the node's other keywords (llama.cpp: it drops them)

    @property
    def dropped(self) -> frozenset[str]:
        """The bound keywords this server would refuse or ignore: never sent."""
        return (frozenset() if self.string_bounds else STRING_BOUNDS) | (
            frozenset() if self.array_bounds else ARRAY_BOUNDS
        )


OPENAI_STRICT: Final = SchemaDialect(string_bounds=False, array_bounds=True, type_lists=True)
FINE_TUNED: Final = SchemaDialect(string_bounds=False, array_bounds=False, type_lists=True)
LLAMA_GRAMMAR: Final = SchemaDialect(string_bounds=True, array_bounds=True, type_lists=False)
GUIDED: Final = SchemaDialect(string_bounds=True, array_bounds=True, type_lists=True)  # vLLM


def fit_schema(schema: dict[str, Any], dialect: SchemaDialect) -> dict[str, Any]:
    """``schema`` as ``dialect``'s server takes it: the bound keywords it refuses dropped, and (where type
    lists lose their keywords) each nullable value as ``anyOf`` [the value, null]. A new dict."""
    return _fit(schema, dialect)


def _fit(node: Any, dialect: SchemaDialect) -> Any:
    if isinstance(node, list):
        return [_fit(item, dialect) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in dialect.dropped:
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _fit(sub, dialect) for name, sub in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = _fit(value, dialect)
        else:
            out[key] = value
    declared = out.get("type")
    if not dialect.type_lists and isinstance(declared, list) and "null" in declared and len(declared) == 2:
        return _any_of_null(out, next(kind for kind in declared if kind != "null"))
    return out


def _any_of_null(node: dict[str, Any], kind: str) -> dict[str, Any]:
    """``{"type": [kind, "null"], …}`` → ``{"description": …, "anyOf": [{"type": kind, …}, {"type": "null"}]}``."""
    value = {key: item for key, item in node.items() if key != "description"}
    value["type"] = kind
    out: dict[str, Any] = {}
    if "description" in node:
        out["description"] = node["description"]
    out["anyOf"] = [value, {"type": "null"}]
    return out


def bounds_problem(schema: Any, path: str = "schema") -> str | None:
    """Where ``schema`` leaves a string or an array without a bound (``maxLength`` / ``maxItems``), or None.

    The check that keeps every schema the box sends bounded (tests hold each schema to it)."""
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            problem = bounds_problem(item, f"{path}[{index}]")
            if problem:
                return problem
        return None
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    kinds = declared if isinstance(declared, list) else [declared]
    if "string" in kinds and "enum" not in schema and "const" not in schema and "maxLength" not in schema:
        return f"{path}: a string without maxLength"
    if "array" in kinds and "maxItems" not in schema:
        return f"{path}: an array without maxItems"
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            problem = bounds_problem(sub, f"{path}.{name}")
            if problem:
                return problem
    for key in ("items", "anyOf"):
        if key in schema:
            problem = bounds_problem(schema[key], f"{path}.{key}")
            if problem:
                return problem
    return None
