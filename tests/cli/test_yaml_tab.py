"""A tab indenting an entry's YAML file is said with the rule it breaks: PyYAML names the
character only ("found character '\\t' that cannot start any token")."""

from __future__ import annotations

import pytest

from d500.errors import ConfigError
from d500.workload import read_yaml


def test_a_tab_in_yaml_says_yaml_indents_with_spaces(tmp_path):
    path = tmp_path / "submission.yaml"
    path.write_text("name: tab\nhyperparameters:\n\tlr: 0.1\n")
    with pytest.raises(ConfigError, match=r"submission.yaml:3:1: invalid YAML: .*'\\t'.* "
                                          r"\(YAML indents with spaces, never tabs\)$"):
        read_yaml(path)
