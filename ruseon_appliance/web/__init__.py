"""Web: WHEP, the device page, the REST API and metrics (aiohttp)."""
