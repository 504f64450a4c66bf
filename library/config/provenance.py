"""Where the values of a resolved Config came from: the config files in the order they were
layered, the keys given on the command line, and for every key the file (or the command line)
whose value won.

It travels beside the values, not among them: two configs with the same values are equal
wherever the values came from, and nothing here reaches a state's config.json, a tracker or a
saved file's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from library.config.suggest import COMMAND_LINE

DEFAULT = "default"  # the source of a value nobody set: the schema's default


@dataclass(frozen=True)
class Provenance:
    """Every field is left out of comparisons, so any two Provenance objects compare equal."""

    files: tuple[str, ...] = field(default=(), compare=False)  # the config files, in order
    command_line: tuple[str, ...] = field(default=(), compare=False)  # keys set there, in order
    # "learning_rate", "datasets[0].batch_size", "datasets[0].subsets[1].num_repeats" -> a file's
    # path as given, COMMAND_LINE, or the dataset_config file; keys left out are DEFAULT.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source(self, key: str) -> str:
        """The file (or COMMAND_LINE) that set ``key``, or DEFAULT."""
        return self.sources.get(key, DEFAULT)

    def layers_text(self) -> str:
        """The layers in words: 'base.toml, run.toml; command line: --seed, --output_name'."""
        files = ", ".join(self.files) if self.files else "none"
        if not self.command_line:
            return files
        return f"{files}; {COMMAND_LINE}: " + ", ".join(f"--{k}" for k in self.command_line)


def provenance(config) -> Provenance:
    """The Provenance of a loaded Config (empty for a Config built in code)."""
    return config._provenance
