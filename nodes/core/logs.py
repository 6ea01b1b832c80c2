"""Quieting the libraries' console chatter around calls whose outcome the pack reports itself."""

import contextlib
import logging


@contextlib.contextmanager
def at_level(logger_or_handler, level: int):
    """Temporarily sets the level of a logger or a handler."""
    previous = logger_or_handler.level
    logger_or_handler.setLevel(level)
    try:
        yield
    finally:
        logger_or_handler.setLevel(previous)


def quiet_cache_dit():
    """cache-dit logs every enable/disable to its own console handler; our report says it all."""
    import cache_dit.logger

    handler = getattr(cache_dit.logger, "_default_handler", None) or logging.NullHandler()
    return at_level(handler, logging.ERROR)
