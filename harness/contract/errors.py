"""The one error type for bad input: it names the offending config key."""


class ConfigError(ValueError):
    """A configuration the harness refuses; `key` is the dotted config key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")
