"""Non-2xx replies become the typed errors of orchard.errors, carrying the server's detail."""

import httpx
import pytest

from orchard import errors

from .conftest import reply, sandbox_info


@pytest.mark.parametrize("status, body, expected", [
    (401, {"detail": "Missing API key. Please provide X-API-Key header."}, errors.AuthError),
    (403, {"detail": "Invalid API key"}, errors.ForbiddenError),
    (409, {"detail": "Sandbox sb1 already exists"}, errors.ConflictError),
    (413, {"detail": "too big"}, errors.PayloadTooLargeError),
    (500, {"detail": "podman died", "error": "BackendError"}, errors.BackendError),
    (500, {"detail": "boom"}, errors.ServerError),
])
def test_status_maps_to_class(client, server, status, body, expected):
    server.on("POST", "/sandboxes", reply(status, body))
    with pytest.raises(expected) as info:
        client.create_sandbox("img")
    assert info.value.detail == body["detail"] and info.value.status_code == status
    assert client.tracked_sandboxes() == []


def test_validation_error_detail_is_readable(client, server):
    detail = [{"loc": ["body", "timeout_seconds"], "msg": "Input should be greater than 0", "type": "x"}]
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("POST", "/sandboxes/sb1/exec", reply(422, {"detail": detail}))
    with pytest.raises(errors.RequestError, match="body.timeout_seconds: Input should be greater than 0"):
        client.get_sandbox("sb1").exec("true")


def test_sandbox_routes_raise_sandbox_not_found(client, server):
    server.on("GET", "/sandboxes/gone", reply(404, {"detail": "Sandbox gone not found"}))
    with pytest.raises(errors.SandboxNotFoundError, match="Sandbox gone not found"):
        client.get_sandbox("gone")


def test_missing_file_is_plain_not_found(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    server.on("GET", "/sandboxes/sb1/files", reply(404, {"detail": "File not found: /nope"}))
    with pytest.raises(errors.NotFoundError) as info:
        client.get_sandbox("sb1").download_content("/nope")
    assert type(info.value) is errors.NotFoundError


def test_non_json_error_body(client, server):
    server.on("GET", "/health", httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(errors.ServerError, match="bad gateway"):
        client.health()


def test_unexpected_reply_shape_is_a_server_error(client, server):
    server.on("GET", "/sandboxes/sb1", reply(200, {"nonsense": True}))
    with pytest.raises(errors.ServerError, match="unexpected reply"):
        client.get_sandbox("sb1")


def test_bad_arguments_fail_before_sending(client, server):
    with pytest.raises(errors.RequestError):
        client.create_sandbox("img", sandbox_id="Not_A_Label")
    server.on("GET", "/sandboxes/sb1", reply(200, sandbox_info()))
    sandbox = client.get_sandbox("sb1")
    with pytest.raises(errors.RequestError):
        sandbox.exec([])
    with pytest.raises(errors.RequestError):
        sandbox.snapshot("host")
    assert [r.url.path for r in server.requests] == ["/sandboxes/sb1"]


def test_delete_is_idempotent(client, server):
    server.on("DELETE", "/sandboxes/gone", reply(404, {"detail": "Sandbox gone not found"}))
    assert client.delete_sandbox("gone").sandbox_id == "gone"


def test_closed_client_refuses_calls(make_client):
    client = make_client()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.health()
