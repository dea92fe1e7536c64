#!/usr/bin/env python3
"""neutron_standin.py — the ONE non-real piece of the OpenStack e2e harness.

Nova calls Neutron during boot (networks "none" still lists ports), evacuate
and delete. This stand-in answers every GET list with an empty collection
(GET /v2.0/ports -> {"ports": []}), GET / with a version document, and any
other request with an empty 200/204 so Nova's cleanup paths proceed. Every
request is logged (method, path) to stderr, which up.sh sends to
log/neutron-standin.log. No authentication is checked.

Usage: neutron_standin.py HOST PORT
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

VERSIONS = {"versions": [{"id": "v2.0", "status": "CURRENT",
                          "links": [{"rel": "self", "href": "http://127.0.0.1:9696/v2.0/"}]}]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, code, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _drain(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)

    def do_GET(self):
        path = urlsplit(self.path).path.rstrip("/")
        parts = [p for p in path.split("/") if p]
        if not parts or parts == ["v2.0"]:
            return self._send(200, VERSIONS)
        if parts[0] == "v2.0":
            parts = parts[1:]
        last = parts[-1]
        if last.endswith(".json"):
            last = last[:-5]
        # /v2.0/<collection> (also extensions, qos/policies, ...)
        if len(parts) == 1 or parts[-2] in ("qos",):
            return self._send(200, {last.replace("-", "_"): []})
        return self._send(404, {"NeutronError": {"type": "NotFound", "message": path}})

    def do_DELETE(self):
        self._drain()
        self._send(204)

    def do_POST(self):
        self._drain()
        self._send(404, {"NeutronError": {"type": "NotFound", "message": self.path}})

    do_PUT = do_POST

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))
        sys.stderr.flush()


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
