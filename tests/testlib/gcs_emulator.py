"""A small in-memory Google Cloud Storage JSON-API server on localhost, for tests/bert_jax/checkpoint/gcs_test.py.

Nothing here reaches the network: the clients are pointed at 127.0.0.1 by environment variables
(`env(port, certs_dir)`), the same way their own test suites do it:

- TensorFlow's tf.io.gfile (tsl gcs_file_system, which etils.epath uses for gs:// when TF is
  installed) has its endpoints hard-coded (https://www.googleapis.com/storage/v1/ and
  https://storage.googleapis.com/); it has no emulator variable. Its libcurl does honour
  HTTPS_PROXY and CURL_CA_BUNDLE (tsl curl_http_request.cc), so this server is also that proxy: it
  answers CONNECT, terminates TLS with a certificate for those two hosts signed by a throw-away CA,
  and serves the JSON API on the decrypted stream. Auth: GOOGLE_AUTH_TOKEN_FOR_TESTING.
- tensorstore (Orbax's array storage) reads TENSORSTORE_GCS_HTTP_URL and talks plain HTTP here;
  google-cloud-storage (Orbax's bucket check) reads STORAGE_EMULATOR_HOST.

Surface (what these clients send, and nothing else): bucket get; object get (metadata, or
media with Range); list (prefix, delimiter, startOffset, endOffset, pages); media and resumable
uploads; delete; rewrite (TF's rename) and the bucket's storageLayout TF reads before renaming a
directory; generation preconditions (tensorstore's atomic writes).
Anything else answers 400 and is logged to stderr as "unsupported", so a client path we do not
cover fails loudly.

  python tests/testlib/gcs_emulator.py CERTS_DIR     # prints the port on stdout, serves until killed
"""

import base64
import datetime
import hashlib
import http.server
import json
import os
import ssl
import sys
import threading
import urllib.parse

BUCKET = "bert-jax-test"
HOSTS = ("www.googleapis.com", "storage.googleapis.com")


def env(port, certs_dir):
  """The environment that sends TF's and tensorstore's gs:// traffic to this server."""
  proxy = f"http://127.0.0.1:{port}"
  return {
      "HTTPS_PROXY": proxy, "https_proxy": proxy,
      "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
      "CURL_CA_BUNDLE": os.path.join(certs_dir, "ca.pem"),
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",
      "TENSORSTORE_GCS_HTTP_URL": proxy,
      # google-cloud-storage: Orbax asks it whether the bucket has a hierarchical namespace.
      "STORAGE_EMULATOR_HOST": proxy,
      # An emulator bug should fail a test in seconds, not after TF's 10 retries from 1 s to 32 s.
      "GCS_RETRY_CONFIG_MAX_RETRIES": "1", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "1000",
  }


def write_certs(certs_dir):
  """A throw-away CA (ca.pem) and a server certificate for HOSTS signed by it (server.pem/.key)."""
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID

  now = datetime.datetime.now(datetime.timezone.utc)

  def cert(subject, key, issuer, issuer_key, ca):
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
      b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]),
                          critical=False)
    return b.sign(issuer_key, hashes.SHA256())

  ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bert_jax test CA")])
  ca = cert(ca_name, ca_key, ca_name, ca_key, ca=True)
  leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]), key, ca_name,
              ca_key, ca=False)
  pem = serialization.Encoding.PEM
  os.makedirs(certs_dir, exist_ok=True)
  with open(os.path.join(certs_dir, "ca.pem"), "wb") as f:
    f.write(ca.public_bytes(pem))
  with open(os.path.join(certs_dir, "server.pem"), "wb") as f:
    f.write(leaf.public_bytes(pem))
  with open(os.path.join(certs_dir, "server.key"), "wb") as f:
    f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class Store:
  """Objects of one bucket: name -> (bytes, generation). Thread safe."""

  def __init__(self):
    self.lock = threading.Lock()
    self.objects = {}
    self.uploads = {}          # upload id -> (name, bytearray, preconditions)
    self.generation = 1_000

  def meta(self, name):
    data, gen = self.objects[name]
    return {"kind": "storage#object", "bucket": BUCKET, "name": name, "size": str(len(data)),
            "generation": str(gen), "metageneration": "1", "contentType":
            "application/octet-stream", "updated": "2026-01-01T00:00:00.000Z",
            "timeCreated": "2026-01-01T00:00:00.000Z",
            "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode()}

  def check(self, name, query):
    """Generation preconditions: None when they hold, else the HTTP status to answer."""
    gen = self.objects[name][1] if name in self.objects else 0
    if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != gen:
      return 412
    if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == gen:
      return 304
    return None

  def put(self, name, data, query):
    with self.lock:
      status = self.check(name, query)
      if status:
        return status, None
      self.generation += 1
      self.objects[name] = (bytes(data), self.generation)
      return 200, self.meta(name)


class Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"
  # Headers and body go out as two writes: without TCP_NODELAY the second waits for the client's
  # delayed ACK (40 ms a request).
  disable_nagle_algorithm = True
  store = None                 # set by serve()
  tls = None

  def log_message(self, fmt, *args):  # quiet unless GCS_EMULATOR_LOG=1 (unsupported: always)
    if os.environ.get("GCS_EMULATOR_LOG"):
      print(f"gcs_emulator: {self.headers.get('Host') if hasattr(self, 'headers') else ''} "
            + fmt % args, file=sys.stderr, flush=True)

  def _send(self, status, body=b"", headers=None):
    if isinstance(body, dict):
      body = json.dumps(body).encode()
      headers = dict(headers or {}, **{"Content-Type": "application/json"})
    self.send_response(status)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _error(self, status, message):
    self._send(status, {"error": {"code": status, "message": message}})

  def _body(self):
    if self.headers.get("Transfer-Encoding") == "chunked":  # TF's uploads (it sets both)
      chunks = []
      while True:
        n = int(self.rfile.readline().split(b";")[0], 16)
        chunks.append(self.rfile.read(n))
        self.rfile.readline()
        if n == 0:
          return b"".join(chunks)
    n = int(self.headers.get("Content-Length") or 0)
    return self.rfile.read(n) if n else b""

  def _route(self):
    """(kind, bucket, object, query) from the request line; object names are unquoted."""
    url = urllib.parse.urlsplit(self.path)
    query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    parts = url.path.split("/")[1:]        # raw: an object name's own '/' is still %2F here
    unq = [urllib.parse.unquote(p) for p in parts]
    host = (self.headers.get("Host") or "").split(":")[0]
    if host == "storage.googleapis.com":   # TF's media downloads: /<bucket>/<object>
      return "media", unq[0], urllib.parse.unquote("/".join(parts[1:])), query
    if unq[:2] == ["upload", "storage"]:
      return "upload", unq[4], None, query
    if unq[:3] == ["storage", "v1", "b"] and len(unq) >= 4:
      if len(unq) == 4:
        return "bucket", unq[3], None, query
      if len(unq) == 5 and unq[4] == "storageLayout":   # TF asks before renaming a directory
        return "layout", unq[3], None, query
      if len(unq) == 5 and unq[4] == "o":
        return "list", unq[3], None, query
      if len(unq) == 6:
        return "object", unq[3], unq[5], query
      if len(unq) == 11 and unq[6] == "rewriteTo":
        return "rewrite", unq[3], unq[5], dict(query, _dest=unq[10])
    return "unknown", None, None, query

  def _unsupported(self):
    # 400, not 501: clients retry a 5xx (TF 10 times, minutes), a test should fail at once.
    print(f"gcs_emulator: unsupported {self.command} {self.headers.get('Host')} {self.path}",
          file=sys.stderr, flush=True)
    self._error(400, f"gcs_emulator does not implement {self.command} {self.path}")

  # -- CONNECT: TLS for TF's hard-coded https endpoints ------------------------------------------
  def do_CONNECT(self):
    host = self.path.split(":")[0]
    if host not in HOSTS:
      self._error(403, f"gcs_emulator only proxies {HOSTS}, not {self.path}")
      return
    self.send_response(200, "Connection established")
    self.end_headers()
    self.wfile.flush()
    conn = self.tls.wrap_socket(self.connection, server_side=True)
    try:
      type(self)(conn, self.client_address, self.server)   # serves the tunnel until it closes
    finally:
      self.close_connection = True

  # -- JSON API ----------------------------------------------------------------------------------
  def do_GET(self):
    kind, bucket, name, query = self._route()
    if kind == "unknown":
      return self._unsupported()
    if bucket != BUCKET:
      return self._error(404, f"no bucket {bucket}")
    if kind == "bucket":
      return self._send(200, {"kind": "storage#bucket", "name": BUCKET, "location": "US"})
    if kind == "layout":
      return self._send(200, {"kind": "storage#storageLayout", "bucket": BUCKET, "location": "US",
                              "locationType": "multi-region",
                              "hierarchicalNamespace": {"enabled": False}})
    if kind == "list":
      return self._list(query)
    with self.store.lock:
      if name not in self.store.objects:
        return self._error(404, f"no object {name}")
      status = self.store.check(name, query)
      data, gen = self.store.objects[name]
      meta = self.store.meta(name)
    if status == 304:
      return self._send(304, b"", {"x-goog-generation": str(gen)})
    if status:
      return self._error(status, "precondition")
    if kind == "object" and query.get("alt") != "media":
      return self._send(200, meta)
    headers = {"x-goog-generation": str(gen), "x-goog-metageneration": "1"}
    rng = self.headers.get("Range")
    if not rng:
      return self._send(200, data, headers)
    start, _, end = rng.split("=", 1)[1].partition("-")
    start, end = int(start), min(int(end) if end else len(data) - 1, len(data) - 1)
    if start >= len(data):
      return self._send(416, b"", dict(headers, **{"Content-Range": f"bytes */{len(data)}"}))
    return self._send(206, data[start:end + 1],
                      dict(headers, **{"Content-Range": f"bytes {start}-{end}/{len(data)}"}))

  def _list(self, query):
    prefix, delim = query.get("prefix", ""), query.get("delimiter", "")
    start = max(query.get("startOffset", ""), query.get("pageToken", ""))
    end = query.get("endOffset")
    limit = int(query.get("maxResults") or 1000)
    with self.store.lock:
      names = sorted(self.store.objects)
      items, prefixes, token = [], [], None
      for n in names:
        if not n.startswith(prefix) or n < start or (end and n >= end):
          continue
        if "pageToken" in query and n == query["pageToken"]:
          continue
        if len(items) + len(prefixes) >= limit:
          token = items[-1]["name"] if items else None
          break
        rest = n[len(prefix):]
        if delim and delim in rest:
          p = prefix + rest.split(delim)[0] + delim
          if p not in prefixes:
            prefixes.append(p)
          continue
        items.append(self.store.meta(n))
    body = {"kind": "storage#objects", "items": items}
    if prefixes:
      body["prefixes"] = prefixes
    if token:
      body["nextPageToken"] = token
    self._send(200, body)

  def do_POST(self):
    kind, bucket, name, query = self._route()
    if bucket != BUCKET and kind in ("upload", "rewrite"):
      return self._error(404, f"no bucket {bucket}")
    if kind == "upload" and query.get("uploadType") == "media":
      status, meta = self.store.put(query["name"], self._body(), query)
      return self._send(200, meta) if status == 200 else self._error(status, "precondition")
    if kind == "upload" and query.get("uploadType") == "resumable":
      self._body()
      uid = hashlib.sha1(os.urandom(8)).hexdigest()
      with self.store.lock:
        self.store.uploads[uid] = (query["name"], bytearray(), query)
      host = self.headers.get("Host")
      scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
      loc = f"{scheme}://{host}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={uid}"
      return self._send(200, b"", {"Location": loc})
    if kind == "rewrite":
      self._body()
      with self.store.lock:
        if name not in self.store.objects:
          return self._error(404, f"no object {name}")
        data = self.store.objects[name][0]
      status, meta = self.store.put(query["_dest"], data, {})
      return self._send(200, {"kind": "storage#rewriteResponse", "done": True,
                              "totalBytesRewritten": meta["size"], "objectSize": meta["size"],
                              "resource": meta})
    self._unsupported()

  def do_PUT(self):
    kind, bucket, _, query = self._route()
    uid = query.get("upload_id")
    if kind != "upload" or uid not in self.store.uploads:
      return self._unsupported() if kind != "upload" else self._error(404, "no such upload")
    body = self._body()
    name, buf, pre = self.store.uploads[uid]
    crange = self.headers.get("Content-Range", "")   # "bytes a-b/N" or "bytes */N"
    spec, _, total = crange.replace("bytes ", "").partition("/")
    if spec != "*":
      a = int(spec.split("-")[0])
      del buf[a:]
      buf += body
    if total != "*" and len(buf) == int(total):
      del self.store.uploads[uid]
      status, meta = self.store.put(name, buf, pre)
      return self._send(200, meta) if status == 200 else self._error(status, "precondition")
    headers = {"Range": f"bytes=0-{len(buf) - 1}"} if buf else {}
    self._send(308, b"", headers)

  def do_DELETE(self):
    kind, bucket, name, query = self._route()
    if kind != "object":
      return self._unsupported()
    with self.store.lock:
      if name not in self.store.objects:
        return self._error(404, f"no object {name}")
      status = self.store.check(name, query)
      if status:
        return self._error(412, "precondition")
      del self.store.objects[name]
    self._send(204)


def serve(certs_dir, port=0):
  """Starts the server on 127.0.0.1 (a free port by default) in a thread; returns it."""
  tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  tls.load_cert_chain(os.path.join(certs_dir, "server.pem"), os.path.join(certs_dir, "server.key"))
  handler = type("BoundHandler", (Handler,), {"store": Store(), "tls": tls})
  server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server


if __name__ == "__main__":
  write_certs(sys.argv[1])
  srv = serve(sys.argv[1])
  print(srv.server_address[1], flush=True)
  threading.Event().wait()
