"""Raw HTTP/1.1 over a socket, for tests that must see when a server answers while a body is still
being sent (an HTTP client library sends the whole body before it reads the reply)."""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path

CHUNK = 256 * 1024


@dataclass
class WireReply:
    status: int
    headers: dict[str, str]
    body: bytes
    sent_when_answered: int  # body bytes the client had sent when the first reply byte arrived


@dataclass
class Upload:
    """A POST whose body is sent only when asked: holds a request open mid-body."""

    sock: socket.socket
    size: int
    sent: int = 0

    def send(self, count: int) -> None:
        count = min(count, self.size - self.sent)
        self.sock.sendall(bytes(count))
        self.sent += count

    def finish(self, timeout: float = 30) -> WireReply:
        self.send(self.size - self.sent)
        return read_reply(self.sock, self.sent, timeout)

    def close(self) -> None:
        self.sock.close()


def request_head(port: int, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def start_upload(port: int, path: str, headers: dict[str, str], size: int) -> Upload:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(request_head(port, path, headers, size))
    return Upload(sock, size)


def post_streaming(port: int, path: str, headers: dict[str, str], size: int, timeout: float = 120) -> WireReply:
    """POST `size` zero bytes, a chunk at a time, for as long as the server reads them; stop sending
    as soon as a reply arrives and note how much of the body had been sent by then."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(request_head(port, path, headers, size))
        sock.setblocking(False)
        chunk, sent = bytes(CHUNK), 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock] if sent < size else [], [], 1.0)
            if readable:
                break
            if writable:
                try:
                    sent += sock.send(chunk[: min(CHUNK, size - sent)])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break  # the server closed: its reply is waiting to be read
        else:
            raise AssertionError(f"no reply in {timeout} s after sending {sent} of {size} bytes")
        sock.setblocking(True)
        return read_reply(sock, sent, timeout)
    finally:
        sock.close()


def read_reply(sock: socket.socket, sent: int, timeout: float = 30) -> WireReply:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise AssertionError(f"the connection closed before a reply: {data!r}")
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    chunked = headers.get("transfer-encoding") == "chunked"
    length = int(headers.get("content-length", "0"))
    while (b"\r\n0\r\n\r\n" not in b"\r\n" + body) if chunked else len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return WireReply(int(status_line.split()[1]), headers, _dechunk(body) if chunked else body[:length], sent)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak so far) of a process, in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(value.split()[0])
    return values
