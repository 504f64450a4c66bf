"""Errors a user can fix. The CLI prints them as one line and exits with their code."""


class DifftuneError(Exception):
    """A problem in the user's input or environment, reported without a traceback."""

    exit_code = 2


class ConfigError(DifftuneError):
    """A config key, value or file is wrong."""


class DataError(DifftuneError):
    """An image folder, image or caption file cannot be used."""


class ModelError(DifftuneError):
    """A model folder or weights file cannot be loaded."""


class CheckpointError(DifftuneError):
    """A saved state or network-weights file cannot be resumed from or loaded."""


class TrainingError(DifftuneError):
    """Training cannot continue (e.g. the loss became NaN); state was saved where possible."""

    exit_code = 1
