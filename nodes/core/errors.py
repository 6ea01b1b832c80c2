"""Errors a user can act on: each names the input that is wrong and says what to do."""


RUN_LIMIT, TEXT_LIMIT = 200, 1000  # error texts: longer unbroken runs and longer texts are cut


def cut(text) -> str:
    """`text` for an error message: an unbroken run longer than RUN_LIMIT characters (a 10,000-character
    name) keeps its start and says how long it was, and the whole is at most TEXT_LIMIT characters."""
    words = []
    for word in str(text).split(" "):
        if len(word) > RUN_LIMIT:
            word = f"{word[:RUN_LIMIT // 2]}…({len(word)} characters)"
        words.append(word)
    text = " ".join(words)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 1] + "…"


class Wan22InputError(ValueError):
    """A value given to a node is wrong. `input_name` is the node input to change. Long values in the
    message are cut (`cut`): a hostile value is never echoed whole."""

    def __init__(self, input_name: str, message: str):
        self.input_name, self.message = cut(input_name), message
        super().__init__(cut(f"{self.input_name}: {message}"))

    def __reduce__(self):  # pickled as its two arguments (a parallel worker's refusal crosses to ComfyUI)
        return type(self), (self.input_name, self.message)
