"""The lean HTTP/1.1 front for the completion routes (aiohttp serves the rest)."""
