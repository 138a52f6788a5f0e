"""A YAML file of settings (``pai-zoo train CONFIG.yaml``, ``pai-zoo rl NAME --config FILE.yaml``): a mapping, or
one line naming the file (and the line) that is not one."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plugin.errors import PaiZooError, no_such_path


def read_settings_yaml(path, error: type[PaiZooError], what: str) -> dict[str, Any]:
    """The mapping in ``path`` with string keys (empty for an empty file); ``error`` is raised for invalid YAML or
    a document that is no mapping, :func:`~pai_zoo.errors.no_such_path` (naming ``what``) for a missing file."""
    import yaml

    path = Path(path)
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise no_such_path(path, what) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise error(f"{path}: expected a mapping of settings, found {type(values).__name__}")
    return {str(k): v for k, v in values.items()}
