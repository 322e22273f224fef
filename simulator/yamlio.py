"""Safe YAML loading shared by every input file (experiments, cluster presets, model files).

``yaml.SafeLoader`` (no Python objects from tags) plus rejection of duplicate keys, which YAML itself would
silently resolve to the last one, and numbers in exponent form without a dot or a signed exponent (``5e10``,
``2.5e9``) read as numbers, as YAML 1.2 and JSON read them (YAML 1.1, PyYAML's, reads them as text). Every
problem becomes a ConfigError naming the file.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import ConfigError
from simulator.inputs import YAML_LIMIT_BYTES, brief, check_size, read_text


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:           # unhashable key: let SafeLoader report it
            dup = False
        if dup:
            raise ConfigError(f"duplicate key {brief(key)} at line {key_node.start_mark.line + 1}")
        if not dup:
            try:
                seen.add(key)
            except TypeError:
                pass
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# after SafeLoader's own int and float patterns (which keep everything they match): 5e10, 5.0e10, -1e-3, .5E2
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                       re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                       list("-+.0123456789"))


def load_yaml_text(text: str, where: str) -> Any:
    """Parse YAML text safely; ``where`` names the source in error messages. A document that expands (aliases
    followed) to more than ``simulator.inputs.MAX_NODES`` values is rejected (alias bombs)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: invalid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise ConfigError(f"{where}: invalid YAML: {brief(str(e), 120)}") from None
    return check_size(data, where)


def load_yaml(path: str | Path, what: str = "file") -> Any:
    """Safely load a YAML file; a missing or unreadable file is a ConfigError too."""
    p = Path(path)
    return load_yaml_text(read_text(p, what, YAML_LIMIT_BYTES), str(p))
