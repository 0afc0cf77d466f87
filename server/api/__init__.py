"""The HTTP API as clients see it: the routes, their bodies and error shapes, the generated reference
(``GET /docs``, docs/api.md) and the browser playground with its static files."""
