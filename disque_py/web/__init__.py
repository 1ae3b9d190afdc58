"""The admin port's web app: /healthz, /readyz, /metrics and the JSON API (starlette).

It knows its node only through a :class:`.handle.NodeHandle` that the shell
(``server/web.py``) fills in, and imports nothing of ``disque_py.server``:

* ``app.py``     the routes and authentication of every request
* ``access.py``  HTTP Basic auth against the node's users (server/acl.py's table)
* ``api.py``     the JSON views; cluster-wide ones ask the peers over RESP
* ``metrics.py`` the Prometheus collector read at scrape time
* ``openapi.json`` the API's description (OpenAPI 3.1), served at /api/openapi.json
* ``static/``    the web page, when installed (served at / and /static)
"""
