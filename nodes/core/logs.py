"""Quieting the libraries' console chatter around calls whose outcome the pack reports itself."""

import contextlib


@contextlib.contextmanager
def at_level(logger_or_handler, level: int):
    """Temporarily sets the level of a logger or a handler."""
    previous = logger_or_handler.level
    logger_or_handler.setLevel(level)
    try:
        yield
    finally:
        logger_or_handler.setLevel(previous)

