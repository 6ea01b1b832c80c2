"""Errors a user can act on: each names the input that is wrong and says what to do."""


class Wan22InputError(ValueError):
    """A value given to a node is wrong. `input_name` is the node input to change."""

    def __init__(self, input_name: str, message: str):
        self.input_name = input_name
        super().__init__(f"{input_name}: {message}")
