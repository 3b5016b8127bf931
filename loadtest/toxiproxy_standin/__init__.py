"""A stand-in for Shopify's Toxiproxy server (2.12), in asyncio.

No ``toxiproxy-server`` binary can be installed everywhere we run (no docker,
not on PyPI), so this package serves Toxiproxy's HTTP API and proxies with its
semantics, as its Go source has them, so tests run unchanged against either:

* ``GET|POST /proxies``, ``GET|POST|PATCH|DELETE /proxies/{name}``,
  ``GET|POST /proxies/{name}/toxics``,
  ``GET|POST|PATCH|DELETE /proxies/{name}/toxics/{toxic}``,
  ``POST /reset``, ``POST /populate``, ``GET /version``; JSON as Go marshals it
  (a proxy carries ``"Logger": {}``; ``/proxies`` is sorted by name) and bodies
  as Go decodes them (:mod:`.gojson`);
* errors as ``{"error": "...", "status": N}`` sent as ``text/plain`` (Go's
  ``http.Error``): 400 bad input, 404 not found, 409 exists, 500 for anything
  else (say, a listen address in use); a ``Mozilla/`` user agent gets 403;
* an omitted listen address (or ``:PORT``) binds every interface, as Go's
  ``net.Listen`` does: callers that want loopback must say ``127.0.0.1:PORT``;
* toxics ``latency``, ``bandwidth``, ``slow_close``, ``timeout``,
  ``reset_peer``, ``limit_data``, ``slicer`` and ``noop``, per stream
  (``upstream`` = client→server, ``downstream`` = server→client), with
  ``toxicity`` rolled per connection, applied to live connections too; a toxic
  changed (or whose next toxic comes or goes) runs again, as Toxiproxy's do.

Modules: :mod:`.api` (routes, middlewares, replies), :mod:`.proxy` (a proxy's
listener and connections), :mod:`.link` (the data plane), :mod:`.toxics`,
:mod:`.addresses` (Go's listen and dial), :mod:`.errors`, :mod:`.gojson`,
:mod:`.runner` (the process, and :func:`run_in_subprocess`).

Data plane: each proxied connection has two links (one per direction). A link
has a reader that reads the source as fast as it can, stamping every chunk
with its read time into a byte-bounded buffer, and a pump task that runs each
chunk through that direction's toxics in order and writes it out. Because the
stamp is taken at read time, a latency toxic works as a delay line (a chunk is
released at read time + latency), so delays do not add up across chunks.

Run ``python -m loadtest.toxiproxy_standin --host 127.0.0.1 --port 0`` (or by its
old name, ``python -m loadtest.toxiproxy_server``); once it accepts it prints
``listening on http://HOST:PORT`` on stderr. In-process use:
:class:`ToxiproxyServer`; from synchronous code (pytest): :func:`run_in_subprocess`.
"""

from __future__ import annotations

from loadtest.toxiproxy_standin.addresses import split_hostport
from loadtest.toxiproxy_standin.api import ToxiproxyServer
from loadtest.toxiproxy_standin.runner import main, run_in_subprocess, serve

__all__ = ["ToxiproxyServer", "main", "run_in_subprocess", "serve", "split_hostport"]
