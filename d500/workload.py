"""Workload and submission YAML files: yaml.safe_load, then validated field by field.

A schema maps a field name to a `Field`; nested mappings use a dict schema as the type. Every
error names the file and the dotted field path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from d500.errors import ConfigError, did_you_mean
from d500.paths import rulebook

# Fields every workload file in levels/ has.
COMMON = {}  # filled below, after Field is defined


@dataclass(frozen=True)
class Field:
    """One field: its type (a Python type, a tuple of types, a nested schema dict, or 'path'),
    whether it is required, its default, the allowed values, and for lists the item type."""

    type: Any
    required: bool = False
    default: Any = None
    choices: tuple | None = None
    items: Any = None
    help: str = ""


class _UniqueKeys(yaml.SafeLoader):
    """yaml's SafeLoader, refusing a field given twice in one mapping (YAML forbids it; PyYAML
    would keep the last silently, so `batch_size: 32` above `batch_size: 64` ran at 64)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` overrides, legitimately
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    again = key in first
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    continue
                if again:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"field '{key}' given twice (first on line {first[key]})",
                        key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, text: str | bytes | None = None) -> tuple[Path, Any]:
    """Parse a YAML file safely (or `text`, the file's content held elsewhere: a package); a
    missing file, a syntax error or a field given twice is a ConfigError naming it."""
    path = Path(path)
    if text is None and path.is_dir():
        raise ConfigError(f"{path}: a folder, where a YAML file is expected")
    if text is None and not path.is_file():
        from d500.paths import looked_in
        raise ConfigError(f"{path}: no such file{looked_in(path)}")
    try:
        if text is not None:
            return path, yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
        with path.open(encoding="utf-8") as f:
            return path, yaml.load(f, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "'\\t'" in problem:  # PyYAML names the tab but not the rule it broke
            problem += " (YAML indents with spaces, never tabs)"
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None


def load(path: str | Path, schema: Mapping[str, Field], *, root: Path | None = None,
         text: str | bytes | None = None) -> dict[str, Any]:
    """Read and validate a YAML mapping (`text`: the file's content, read from elsewhere). A
    'path' field resolves against the file's folder and must stay inside `root`: by default the
    rulebook for a file in it, else the file's own folder (a user's workload may name a model
    beside it; `../` out of it is refused)."""
    path, data = read_yaml(path, text)
    if root is None:
        folder = path.resolve().parent
        root = rulebook() if folder.is_relative_to(rulebook()) else folder
    if data is None:
        raise ConfigError(f"{path}: empty, where a mapping of fields is expected")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of fields at top level, "
                          f"got {type(data).__name__}")
    return validate(data, schema, path, "", root)


def validate(data: Mapping[str, Any], schema: Mapping[str, Field], path: Path, prefix: str,
             root: Path) -> dict[str, Any]:
    """Check `data` against `schema`; returns a new dict with defaults filled in. A file of
    another level than the schema's is said so first (its fields are another level's)."""
    level, given = schema.get("level"), data.get("level")
    if level is not None and level.choices and isinstance(given, int) and \
            given not in level.choices:
        raise other_level(path, given, level.choices)
    unknown = [k for k in data if k not in schema]
    if unknown and not prefix and _other_kind(data, schema):
        raise ConfigError(f"{path}: {_other_kind(data, schema)}")
    if unknown:
        hint = did_you_mean(unknown[0], schema)
        raise ConfigError(f"{path}: unknown field '{prefix}{unknown[0]}' "
                          f"(allowed: {', '.join(schema)}{'; ' + hint if hint else ''})")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        where = f"{prefix}{name}"
        if name not in data or data[name] is None:
            if spec.required:
                raise ConfigError(f"{path}: missing required field '{where}'")
            out[name] = spec.default
            continue
        out[name] = _check(data[name], spec.type, spec, path, where, root)
    return out


def _other_kind(data: Mapping[str, Any], schema: Mapping[str, Field]) -> str:
    """What a file of the other kind is, told by a field only that kind has: an entry's
    submission.yaml given as the workload, or a workload file as the entry (each was said as
    the first field the schema lacked: 'unknown field authors', 'unknown field model')."""
    for fields, what, expected in ((("workloads", "optimizer", "operator"),
                                    "an entry's submission.yaml", "a workload file"),
                                   (("metrics", "rank_by"),
                                    "a workload file", "an entry's submission.yaml")):
        field = next((f for f in fields if f in data and f not in schema), None)
        if field:
            return f"{what} (field '{field}'), where {expected} is expected"
    return ""


def _check(value: Any, typ: Any, spec: Field, path: Path, where: str, root: Path) -> Any:
    if isinstance(typ, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: field '{where}' must be a mapping, "
                              f"got {type(value).__name__}")
        return validate(value, typ, path, where + ".", root)
    if typ == "path":
        if not isinstance(value, str):
            raise ConfigError(f"{path}: field '{where}' must be a file path")
        resolved = (path.parent / value).resolve()
        if not resolved.is_relative_to(root.resolve()):
            raise ConfigError(f"{path}: field '{where}' points outside {root}: {value} (a "
                              f"workload may name files in its own folder or below it)")
        if not resolved.exists():
            raise ConfigError(f"{path}: field '{where}': no such file {value}")
        return resolved
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: field '{where}' must be a list, "
                              f"got {type(value).__name__}")
        if spec.items is not None:
            item_spec = Field(spec.items, choices=spec.choices)
            return [_check(v, spec.items, item_spec, path, f"{where}[{i}]", root)
                    for i, v in enumerate(value)]
        return value
    if isinstance(value, bool) and typ is not bool and not (
            isinstance(typ, tuple) and bool in typ):
        raise ConfigError(f"{path}: field '{where}' must be {_name(typ)}, got a boolean")
    if not isinstance(value, typ):
        raise ConfigError(f"{path}: field '{where}' must be {_name(typ)}, "
                          f"got {type(value).__name__} {value!r}")
    if spec.choices is not None and value not in spec.choices:
        hint = did_you_mean(value, spec.choices)
        raise ConfigError(f"{path}: field '{where}' is {value!r}; "
                          f"allowed: {', '.join(map(str, spec.choices))}"
                          f"{'; ' + hint if hint else ''}")
    return value


def check_metrics(data: Mapping[str, Any], path: Path, measured: Sequence[str], level: int
                  ) -> str:
    """The COMMON `metrics` and `rank_by` of a validated workload: defined in metrics/, measured
    by its level, rank_by among them. Returns rank_by (default: the first metric)."""
    from d500 import metrics
    names = data["metrics"]
    if not names:
        raise ConfigError(f"{path}: field 'metrics' is empty")
    metrics.check(names, path)
    for name in names:
        if name not in measured:
            raise ConfigError(f"{path}: field 'metrics' names '{name}', which level {level} does "
                              f"not measure (it measures {', '.join(measured)})")
    rank_by = data["rank_by"] or names[0]
    if rank_by not in names:
        hint = did_you_mean(rank_by, names)
        raise ConfigError(f"{path}: field 'rank_by' is '{rank_by}', not one of its metrics "
                          f"({', '.join(names)}{'; ' + hint if hint else ''})")
    return rank_by


@dataclass(frozen=True)
class Rules:
    """The scoring rules of a workload: the metrics it reports, the one it ranks by, how runs
    aggregate, and its description. The ledger checks them when a run starts; the leaderboard
    reads them back from the workload text stored with each run."""

    metrics: tuple[str, ...]
    rank_by: str | None
    aggregate: str | None
    description: str


def mapping(text: str | bytes, where: str | Path) -> Mapping[str, Any]:
    """A workload file's text read as its top-level mapping of fields; invalid YAML or another
    shape is a ConfigError naming `where`."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: invalid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of fields at top level")
    return data


def rules(text: str, where: str | Path) -> Rules:
    """The COMMON scoring fields of a workload file's text, checked against metrics/; a problem
    is a ConfigError naming `where` and the field."""
    from d500 import metrics
    data = mapping(text, where)
    names = data.get("metrics") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: field 'metrics' must be a list of metric names")
    rank_by = data.get("rank_by") or (names[0] if names else None)
    if rank_by is not None and rank_by not in names:
        raise ConfigError(f"{where}: field 'rank_by' is '{rank_by}', not one of its metrics")
    metrics.check(names, where)
    how = data.get("aggregate")
    choices = COMMON["aggregate"].choices or ()
    if how is not None and how not in choices:
        raise ConfigError(f"{where}: field 'aggregate' is {how!r}; allowed: {', '.join(choices)}")
    return Rules(tuple(names), rank_by, how, str(data.get("description") or ""))


def level_field(number: int) -> Field:
    """The `level` field of a level-`number` schema: a file of another level is said so before
    any of its fields (validate), not as the first field this level does not know."""
    return Field(int, required=True, choices=(number,),
                 help=f"{number}: the level whose rules it follows (d500.levels)")


def other_level(path: str | Path, given: Any, takes: Sequence[int]) -> ConfigError:
    """The error of a file of level `given` where a command takes only the levels `takes`."""
    return ConfigError(f"{path}: a level-{given} file (field 'level'), where this command "
                       f"takes level {' or '.join(map(str, takes))}")


def model_source(model: Mapping[str, Any], path: Path, sources: Sequence[str]) -> str:
    """Which one of `sources` the `model` mapping names (exactly one; a builder d500 has)."""
    given = [k for k in sources if model.get(k) is not None]
    if len(given) != 1:
        raise ConfigError(f"{path}: field 'model' needs exactly one of {', '.join(sources)} "
                          f"(got {', '.join(given) or 'none'})")
    if given[0] == "builder":
        from d500 import builders
        known = [*builders.BUILDERS, *builders.LANGUAGE]
        if model["builder"] not in known:
            raise ConfigError(f"{path}: field 'model.builder' is {model['builder']!r}; known: "
                              f"{', '.join(known)}")
    return given[0]


def find(name_or_path: str, folder: Path, level: int, noun: str = "workload") -> Path:
    """A workload file by path, or by file stem or `name:` field among `folder`'s files; a
    mistake names it by the level's own word for its workloads (`noun`: level 0's are cases)."""
    if not str(name_or_path).strip():  # Path('') is '.', which said '.: no such workload file'
        raise ConfigError(f"the {noun} is empty: give a level-{level} {noun}'s name or file "
                          f"(in {folder})")
    p = Path(name_or_path)
    if p.is_file() and p.suffix.lower() == ".onnx":  # `d500 net bench m.onnx`: 'not a text file'
        raise ConfigError(f"{p}: an ONNX model, where a level-{level} {noun}'s name or YAML file "
                          f"goes" + (f" (`d500 net check {p}` checks a model file; a workload "
                                     f"file's `model: {{file: {p.name}}}` times it)"
                                     if level == 1 else ""))
    if p.is_file():
        return p
    if p.suffix in (".yaml", ".yml") and not p.exists():
        shipped = folder / p.name  # levels/1-networks/X.yaml typed outside a checkout
        from d500.paths import looked_in
        raise ConfigError(f"{p}: no such {noun} file{looked_in(p)}" + (
            f" (d500's own '{p.stem}' is found by its name: give {p.stem})"
            if shipped.is_file() and not p.is_absolute() else ""))
    files = sorted(folder.glob("*.yaml"))
    for f in files:
        if f.stem == name_or_path:  # a name, even where a folder of that name is here
            return f
    for f in files:
        try:
            _, data = read_yaml(f)
        except ConfigError:
            continue
        if isinstance(data, Mapping) and data.get("name") == name_or_path:
            return f
    if p.exists():  # a folder (or a device), which said 'no such workload file'
        raise ConfigError(f"{p}: a folder, where a level-{level} {noun}'s file or name is "
                          f"expected (in {folder})" if p.is_dir() else
                          f"{p}: not a {noun} file")
    hint = did_you_mean(name_or_path, [f.stem for f in files])
    other = sorted(f for f in folder.parent.glob(f"[0-9]-*/{name_or_path}.yaml")
                   if f.parent != folder)  # train mlp-mnist: a level-1 workload's name
    if other:
        hint = f"{name_or_path} is a workload of another level: {other[0]}"
    known = ", ".join(f.stem for f in files)
    raise ConfigError(f"no level-{level} {noun} named '{name_or_path}' (in {folder}: {known}"
                      f"{'; ' + hint if hint else ''})")


def _name(typ: Any) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            dict: "a mapping"}.get(typ, getattr(typ, "__name__", str(typ)))


COMMON.update({
    "name": Field(str, required=True, help="the workload's name, unique within its level"),
    "level": Field(int, required=True, help="the level whose rules it follows (d500.levels)"),
    "description": Field(str, default=""),
    "metrics": Field(list, required=True, items=str,
                     help="metric names (files in metrics/) this workload reports"),
    "rank_by": Field(str, help="the metric the leaderboard ranks by (default: the first)"),
    "aggregate": Field(str, default="median", choices=("median", "olympic_mean"),
                       help="aggregation over repetitions and seeds"),
})
