"""A small client of etcd's v3 HTTP/JSON gateway (/v3/kv/..., /v3/lease/...,
/v3/watch), on http.client: what cluster membership needs and no more.

Why not a library (docs/operations.md, "Cluster"): python-etcd3 is
unmaintained and pins grpcio/protobuf versions that clash with the
engines'; etcd3gw (maintained) talks to one endpoint and pulls requests and
futurist in. The gateway is part of every etcd server, JSON over HTTP, so
a hundred lines of plain code do: several endpoints with fail-over, every
request bounded by a timeout.

Keys and values travel base64-encoded; int64 fields come as strings.
"""
import base64
import http.client
import json
import socket

DEFAULT_PORT = 2379
# gRPC status codes etcd answers with that another endpoint may not give.
_UNAVAILABLE_CODES = {4, 14}        # DEADLINE_EXCEEDED, UNAVAILABLE
_NOT_FOUND = 5


class EtcdError(Exception):
    """No endpoint answered, or etcd refused the request (code: its gRPC
    status, None when no endpoint could be reached)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class WatchIdle(EtcdError):
    """A watch said nothing for its idle time: no failure, watch anew."""


def parse_endpoints(text):
    """["host:port", ...] from "H1[:port],H2[:port]"; ValueError when empty."""
    endpoints = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty etcd endpoint in {text!r}")
        host, bracket, rest = part.rpartition("]")
        has_port = ":" in (rest if bracket else part)
        if has_port:
            port = part.rsplit(":", 1)[1]
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bad port in etcd endpoint {part!r}")
        endpoints.append(part if has_port else f"{part}:{DEFAULT_PORT}")
    return endpoints


def _b64(data):
    return base64.b64encode(data).decode()


def _unb64(text):
    return base64.b64decode(text or "")


def prefix_end(prefix):
    """The range_end that makes [prefix, end) every key under prefix."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _malformed(function):
    """Turns an answer of the wrong shape (a field of another type, bad
    base64) into an EtcdError, like any other failed request."""
    def checked(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            raise EtcdError(f"malformed answer from etcd: {e!r}") from None
    return checked


def _split(endpoint):
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class Etcd:
    """Requests to the first of endpoints that answers, starting from the
    last one that did. timeout_s bounds each request to one endpoint."""

    def __init__(self, endpoints, timeout_s=1.0):
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._good = 0

    def _post_one(self, endpoint, path, body):
        conn = http.client.HTTPConnection(*_split(endpoint), timeout=self.timeout_s)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            raise EtcdError(f"{endpoint}{path}: HTTP {resp.status}, not JSON") from None
        if not isinstance(answer, dict):
            raise EtcdError(f"{endpoint}{path}: not a JSON object")
        if "error" in answer or resp.status != 200:
            code = answer.get("code")
            raise EtcdError(f"{endpoint}{path}: {answer.get('message') or resp.status}",
                            code if isinstance(code, int) else None)
        return answer

    def post(self, path, body):
        """The JSON answer of the first endpoint that gives one; EtcdError
        when none does, or when etcd refuses the request itself."""
        failures = []
        n = len(self.endpoints)
        for i in range(n):
            at = (self._good + i) % n
            try:
                answer = self._post_one(self.endpoints[at], path, body)
            except (OSError, http.client.HTTPException) as e:
                failures.append(f"{self.endpoints[at]}: {e or type(e).__name__}")
                continue
            except EtcdError as e:
                if e.code not in _UNAVAILABLE_CODES:
                    raise
                failures.append(str(e))
                continue
            self._good = at
            return answer
        raise EtcdError("no etcd endpoint answered (" + "; ".join(failures) + ")")

    # ------------------------------------------------------------ kv

    def put(self, key, value, lease=0):
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.post("/v3/kv/put", body)

    @_malformed
    def range_prefix(self, prefix):
        """(revision, [(key, value, lease id)]) of every key under prefix."""
        answer = self.post("/v3/kv/range", {"key": _b64(prefix),
                                            "range_end": _b64(prefix_end(prefix))})
        revision = int(answer.get("header", {}).get("revision", 0))
        return revision, [(_unb64(kv.get("key")), _unb64(kv.get("value")),
                           int(kv.get("lease", 0))) for kv in answer.get("kvs", [])]

    # ------------------------------------------------------------ leases

    @_malformed
    def grant(self, ttl_s):
        """A new lease of ttl_s seconds; its id."""
        answer = self.post("/v3/lease/grant", {"TTL": str(ttl_s)})
        lease = int(answer.get("ID", 0))
        if not lease:
            raise EtcdError(f"lease grant gave no id: {answer}")
        return lease

    @_malformed
    def keepalive(self, lease):
        """Renews the lease; its TTL in seconds, 0 when it is gone."""
        answer = self.post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    @_malformed
    def time_to_live(self, lease):
        """Seconds the lease has left, -1 when it is gone."""
        answer = self.post("/v3/lease/timetolive", {"ID": str(lease)})
        return int(answer.get("TTL", -1))

    def revoke(self, lease):
        """Ends the lease and deletes its keys; a lease already gone is no error."""
        try:
            self.post("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if e.code != _NOT_FOUND:
                raise

    # ------------------------------------------------------------ watch

    def watch(self, prefix, start_revision, idle_s):
        """A Watch of every change under prefix from start_revision on, on
        the first endpoint that takes it."""
        failures = []
        n = len(self.endpoints)
        for i in range(n):
            at = (self._good + i) % n
            try:
                watch = Watch(self.endpoints[at], prefix, start_revision,
                              self.timeout_s, idle_s)
            except (OSError, http.client.HTTPException, EtcdError) as e:
                failures.append(f"{self.endpoints[at]}: {e or type(e).__name__}")
                continue
            self._good = at
            return watch
        raise EtcdError("no etcd endpoint took the watch (" + "; ".join(failures) + ")")


class Watch:
    """One watch stream: events() yields the changes as etcd sends them,
    each a list of (kind, key, value) with kind "PUT" or "DELETE", and
    raises EtcdError when the stream ends, breaks, or says nothing for
    idle_s (the caller reads the prefix again and watches anew)."""

    def __init__(self, endpoint, prefix, start_revision, timeout_s, idle_s):
        self.endpoint = endpoint
        self._conn = http.client.HTTPConnection(*_split(endpoint), timeout=timeout_s)
        request = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                      "start_revision": str(start_revision)}}
        try:
            self._conn.request("POST", "/v3/watch", json.dumps(request),
                               {"Content-Type": "application/json"})
            self._resp = self._conn.getresponse()
            if self._resp.status != 200:
                raise EtcdError(f"{endpoint}/v3/watch: HTTP {self._resp.status}")
            if self._conn.sock is None:     # an answer that was all there is
                raise EtcdError(f"{endpoint}/v3/watch: no stream")
            self._conn.sock.settimeout(idle_s)
            created = self._next()
        except BaseException:
            self.close()
            raise
        if not created.get("created"):
            self.close()
            raise EtcdError(f"{endpoint}/v3/watch: not created: {created}")

    def _next(self):
        try:
            line = self._resp.readline()
        except TimeoutError:
            raise WatchIdle(f"{self.endpoint} watch: idle") from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise EtcdError(f"{self.endpoint} watch: {e or type(e).__name__}") from None
        if not line:
            raise EtcdError(f"{self.endpoint} watch: stream ended")
        try:
            message = json.loads(line)
        except ValueError:
            raise EtcdError(f"{self.endpoint} watch: not JSON: {line[:200]!r}") from None
        if not isinstance(message, dict) or "error" in message:
            raise EtcdError(f"{self.endpoint} watch: {str(message)[:200]}")
        result = message.get("result", {})
        if not isinstance(result, dict):
            raise EtcdError(f"{self.endpoint} watch: result {str(result)[:200]}")
        if result.get("canceled"):
            raise EtcdError(f"{self.endpoint} watch canceled: "
                            f"{result.get('cancel_reason', 'compacted?')}")
        return result

    @_malformed
    def _batch(self, result):
        return [(event.get("type", "PUT"), _unb64(event.get("kv", {}).get("key")),
                 _unb64(event.get("kv", {}).get("value")))
                for event in result.get("events", [])]

    def events(self):
        while True:
            batch = self._batch(self._next())
            if batch:
                yield batch

    def interrupt(self):
        """Wakes a read blocked in events() (which then raises) from another
        thread; the reading thread closes the stream."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self._conn.close()
