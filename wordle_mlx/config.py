"""Configuration: strict pydantic models, loaded and validated in one place.

Every stage has a model with `extra="forbid"`, so a misspelt key is an error, not a silent default.
`load_config(path, Model, overrides)` reads the JSON file, applies command-line overrides (dotted keys),
validates, and turns any problem into a one-line `UserError` naming the file, the field and the value.
Relative paths inside a config are resolved against the config file's folder (`resolve_path`).

Paths that end up in files or messages are written relative where they can be, so that a run folder, an
eval JSON or an adapter can be moved or committed with the checkout: `display_path` (relative to the working
folder, for messages and result records) and `config_relative_path` (relative to the folder of the file that
stores it, for a config that is read back, e.g. a run folder's config.json, which `--resume` loads with
`load_config` and so resolves against that folder).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Type, TypeVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from .errors import UserError

M = TypeVar("M", bound="StrictModel")
MODEL_SPEC_HELP = ("Model spec (see llm/model/models.py): builtin:NAME, a Hub id, or a folder, which like the CLI's --model is "
                   "relative to the working directory, not to the config file.")


class StrictModel(BaseModel):
    """A config section: unknown fields are refused (`format_validation_error` names the file, the field and the
    value in one line)."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)
    _base_dir: Path | None = PrivateAttr(default=None)
    _source: str = PrivateAttr(default="")


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line: `source: field.path: message (got value)`, plus a count of further errors."""
    errors = err.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] in ("extra_forbidden", "unexpected_keyword_argument"):  # models / dataclass sections
        msg = "unknown field"
    more = f" [and {len(errors) - 1} more error(s)]" if len(errors) > 1 else ""
    if not loc and isinstance(first.get("input"), dict):   # a check of the whole config names its own fields
        return f"{source}: {msg}{more}"
    got = f" (got {_short(first['input'])})" if "input" in first and first["type"] != "missing" else ""
    return f"{source}: {loc or '(top level)'}: {msg}{got}{more}"


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"override {dotted}: {key} is not a section")
    node[keys[-1]] = value


def read_json_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a JSON file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    if not text.strip():
        raise UserError(f"{path}: file is empty, expected a JSON object")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply") from None


def validate_config(data: Any, model: Type[M], source: str) -> M:
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    try:
        cfg = model.model_validate(data)
    except ValidationError as err:
        raise UserError(format_validation_error(err, source)) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        raise UserError(f"{source}: {err}") from None
    cfg._source = source
    return cfg


def load_config(path: str | Path | None, model: Type[M], overrides: dict[str, Any] | None = None) -> M:
    """Read JSON `path` (or start empty), apply dotted overrides, validate against `model`."""
    data: Any = read_json_file(path) if path is not None else {}
    if isinstance(data, dict):
        for key, value in (overrides or {}).items():
            if value is not None:
                set_dotted(data, key, value)
    cfg = validate_config(data, model, str(path) if path is not None else "command line")
    cfg._base_dir = Path(path).resolve().parent if path is not None else Path.cwd()
    return cfg


def config_dir(cfg: BaseModel) -> Path:
    """Folder against which relative paths in `cfg` are resolved."""
    return getattr(cfg, "_base_dir", None) or Path.cwd()


def resolve_path(cfg: BaseModel, value: str | Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (config_dir(cfg) / p)


def _absolute(p: str | Path) -> Path:
    """`p` made absolute against the working folder, `~` expanded, symlinks resolved."""
    path = Path(p).expanduser()
    return (path if path.is_absolute() else Path.cwd() / path).resolve()


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def display_path(p: str | Path) -> str:
    """`p` relative to the working folder when it lies inside it (for messages and result records), else
    as given. Never raises, e.g. for a folder that does not exist yet."""
    try:
        full, cwd = _absolute(p), Path.cwd().resolve()
    except (OSError, RuntimeError, ValueError):
        return str(p)
    return os.path.relpath(full, cwd) if _inside(full, cwd) else str(p)


def config_relative_path(p: str | Path, base: str | Path, root: str | Path | None = None) -> str:
    """How a file in folder `base` stores the path `p` (relative paths are taken against the working folder):
    relative to `base` when both lie inside `root` (default: the working folder, the checkout a run belongs
    to), so the two can move together and `load_config` + `resolve_path` find it again; else absolute (a path
    outside the project is pinned where it is)."""
    full, base_full = _absolute(p), _absolute(base)
    root_full = _absolute(root if root is not None else Path.cwd())
    if _inside(full, root_full) and _inside(base_full, root_full):
        return Path(os.path.relpath(full, base_full)).as_posix()
    return str(full)


def config_hash(cfg: BaseModel | dict) -> str:
    """Ten hex digits of the config (a model, or its JSON dump as a run folder's config.json holds it)."""
    blob = json.dumps(cfg if isinstance(cfg, dict) else cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:10]
