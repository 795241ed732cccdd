"""The one error type of a bad study: raised before any compute is spent."""


class ConfigError(ValueError):
    """An invalid study config or cell; the message names the key."""
