"""The one HTTP layer (ragen_jax.json_http) on a small declaration of its own, on 127.0.0.1:
path parameters, a public route, the order of the checks, both error forms, kept-alive
connections and unread bodies."""

import http.client
import json

import pytest

from ragen_jax import json_http

TOKEN = "tok-7c2"
TIMEOUT_S = 30.0


class _OtherError(json_http.HttpError):
  """Errors in another form, as the model server's are."""

  def __init__(self, status, message):
    super().__init__(status, message)
    self.answer = {"error": {"message": message}}


class _Notes(json_http.JsonServer):
  """Notes by name: PUT-free on purpose (a PUT must get 405, not 501)."""

  def __init__(self, **options):
    self.notes = {}
    super().__init__(**options)

  def _health(self, request):
    del request
    return {"ok": True}

  def _write(self, request):
    self.notes[request.params["name"]] = json_http.field(request.json(), "text", str)
    return {"ok": True}

  def _read(self, request):
    name = request.params["name"]
    if name not in self.notes:
      raise json_http.HttpError(404, f"no note {name!r}")
    return {"text": self.notes[name]}

  def _crash(self, request):
    raise RuntimeError(f"bug on {request.params['name']}")

  ROUTES = (
      json_http.Route("GET", "/health", _health, public=True),
      json_http.Route("POST", "/notes/{name}", _write),
      json_http.Route("GET", "/notes/{name}", _read),
      json_http.Route("GET", "/notes/{name}/crash", _crash),
  )


class _KeptAlive(_Notes):
  ERROR = _OtherError
  KEEP_ALIVE = True


@pytest.fixture(name="server", params=[_Notes, _KeptAlive])
def _server(request):
  server = request.param(token=TOKEN, max_body_bytes=64)
  server.start()
  yield server
  server.close()


def _call(connection, method, path, body=None, token=TOKEN):
  headers = {"Authorization": f"Bearer {token}"} if token else {}
  connection.request(method, path, body=body, headers=headers)
  response = connection.getresponse()
  return response.status, json.loads(response.read()), dict(response.getheaders())


def _message(server, answer):
  return answer["error"]["message"] if server.KEEP_ALIVE else answer["error"]


def test_routes_parameters_and_errors(server):
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
  try:
    assert _call(connection, "POST", "/notes/a", b'{"text": "hi"}')[:2] == (200, {"ok": True})
    assert _call(connection, "GET", "/notes/a")[:2] == (200, {"text": "hi"})
    status, answer, _ = _call(connection, "GET", "/notes/b")
    assert status == 404 and answer["error"] == "no note 'b'"  # the handler's own form
    cases = [
        ("GET", "/notes/", None, 404),
        ("GET", "/notes/a/b", None, 404),
        ("POST", "/notes/a", b'{"text": 3}', 400),
        ("POST", "/notes/a", b"[1]", 400),
        ("POST", "/notes/a", b"{not json", 400),
        ("POST", "/notes/a", b'{"text": "' + b"x" * 64 + b'"}', 413),
        ("GET", "/notes/a/crash", None, 500),
    ]
    for method, path, body, expected in cases:
      status, answer, _ = _call(connection, method, path, body)
      assert status == expected, (method, path, answer)
      assert answer["error"], answer  # the handler's form (field) or the server's
    status, answer, headers = _call(connection, "PUT", "/notes/a", b"{}")
    assert status == 405 and headers["Allow"] == "POST, GET", answer
    assert "bug on a" in _message(server, _call(connection, "GET", "/notes/a/crash")[1])
  finally:
    connection.close()


def test_the_token_is_checked_before_the_path_except_on_a_public_route(server):
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
  try:
    for path in ("/notes/a", "/nowhere"):
      status, answer, headers = _call(connection, "GET", path, token="wrong")
      assert status == 401 and headers["WWW-Authenticate"] == "Bearer", answer
      assert TOKEN not in json.dumps(answer)
    assert _call(connection, "GET", "/health", token="")[:2] == (200, {"ok": True})
    assert _call(connection, "POST", "/health", b"{}", token="")[0] == 405
  finally:
    connection.close()


def test_a_kept_alive_connection_serves_on_and_an_unread_body_closes_it(server):
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
  try:
    for _ in range(2):
      status, _, headers = _call(connection, "GET", "/health")
      assert status == 200 and (headers.get("Connection") != "close") == server.KEEP_ALIVE
    _, _, headers = _call(connection, "GET", "/nowhere", b'{"unread": true}')
    assert headers.get("Connection") == "close"  # the next request must not start in the body
    assert _call(connection, "GET", "/health")[0] == 200  # on a new connection
  finally:
    connection.close()


def test_a_server_binds_the_loopback_interface_by_default():
  server = _Notes()
  try:
    assert server.server_address[0] == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.port}" and not server.token
  finally:
    server.close()
