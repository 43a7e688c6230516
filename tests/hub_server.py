"""A Hugging Face hub-compatible HTTP server on this machine, for the tests (HF_ENDPOINT).

It serves in-memory repositories with the endpoints `huggingface_hub.snapshot_download` and
`datasets.load_dataset` use: repo info (/api/{models,datasets}/ID[/revision/REV]), the file tree
(/api/.../tree/REV[/PATH]), paths-info, and file downloads (/[datasets/]ID/resolve/REV/PATH,
HEAD and GET, with byte ranges). Every file is served as a plain git blob (no LFS, no Xet), and
every repository has one commit, `main`.

Faults the tests inject, like the real hub's answers:
- `gated[repo] = token`: 401 without that token (403 with another), `X-Error-Code: GatedRepo`;
- an unknown repository: 404 with `X-Error-Code: RepoNotFound`;
- `fail_next[repo] = n`: the next n requests for the repo answer 503;
- `cut_next[(repo, path)] = [n_bytes, ...]`: each of the next GETs of that file (one per list
  entry) sends its full Content-Length, then n_bytes of the body, then closes the connection.
`requests` records (method, path, Authorization header) of every request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse


def blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    def __init__(self):
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}  # (model|dataset, id) -> files
        self.gated: dict[str, str] = {}
        self.fail_next: dict[str, int] = {}
        self.cut_next: dict[tuple[str, str], list[int]] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()

    def add(self, kind: str, repo: str, files: dict[str, bytes]) -> None:
        self.repos[(kind, repo)] = dict(files)

    def sha(self, kind: str, repo: str) -> str:
        h = hashlib.sha1(f"{kind}/{repo}".encode())
        for path, data in sorted(self.repos[(kind, repo)].items()):
            h.update(path.encode() + b"\0" + blob_oid(data).encode())
        return h.hexdigest()

    def start(self, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
        """Serve in a daemon thread; returns the server and its endpoint URL."""
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"


KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
REPO = r"(?P<repo>[^/]+/[^/]+)"
API = re.compile(rf"^/api/(?P<kinds>models|datasets)/{REPO}(?:/revision/(?P<rev>[^/]+))?/?$")
TREE = re.compile(rf"^/api/(?P<kinds>models|datasets)/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
PATHS = re.compile(rf"^/api/(?P<kinds>models|datasets)/{REPO}/paths-info/(?P<rev>[^/]+)$")
RESOLVE = re.compile(rf"^/(?:(?P<kinds>datasets)/)?{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # -- answers ---------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, headers=None) -> None:
        self._send(200, json.dumps(obj).encode(), headers)

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    # -- requests --------------------------------------------------------------------------------

    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def _route(self) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        hub = self.hub
        hub.requests.append((self.command, path, self.headers.get("Authorization")))
        for pattern in (API, TREE, PATHS, RESOLVE):
            m = pattern.match(path)
            if m:
                break
        else:
            return self._error(404, None, f"no route {path}")
        kind = KINDS.get(m["kinds"] or "models")
        repo = m["repo"]
        key = (kind, repo)
        if key not in hub.repos:
            return self._error(404, "RepoNotFound", "Repository not found")
        with hub.lock:
            if hub.fail_next.get(repo, 0) > 0:
                hub.fail_next[repo] -= 1
                return self._error(503, None, "Service Unavailable (injected)")
        if repo in hub.gated:
            auth = self.headers.get("Authorization")
            if auth != f"Bearer {hub.gated[repo]}":
                status = 403 if auth else 401
                return self._error(status, "GatedRepo", f"Access to model {repo} is restricted. "
                                   "You must have access to it and be authenticated to access it.")
        rev = m["rev"] or "main"
        sha = hub.sha(kind, repo)
        if rev not in ("main", sha):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = hub.repos[key]
        if pattern is API:
            return self._json({
                "_id": sha[:24], "id": repo, "author": repo.split("/")[0], "sha": sha,
                "lastModified": "2026-01-01T00:00:00.000Z", "private": False,
                "gated": "manual" if repo in hub.gated else False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "cardData": {},
                "siblings": [{"rfilename": p} for p in sorted(files)],
            })
        if pattern is TREE:
            query = parse_qs(url.query)
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            return self._json(self._tree(files, (m["path"] or "").strip("/"), recursive, sha))
        if pattern is PATHS:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            body = (json.loads(raw) if raw.startswith("{") else
                    {k: v for k, v in parse_qs(raw).items()})
            wanted = body.get("paths", [])
            wanted = [wanted] if isinstance(wanted, str) else wanted
            entries = []
            for p in wanted:
                p = p.strip("/")
                if p in files:
                    entries.append(self._file_entry(p, files[p], sha))
                elif any(f.startswith(p + "/") for f in files) or p == "":
                    entries.append(self._dir_entry(p, sha))
            return self._json(entries)
        return self._resolve(repo, m["path"], files, sha)

    @staticmethod
    def _file_entry(path: str, data: bytes, sha: str) -> dict:
        return {"type": "file", "oid": blob_oid(data), "size": len(data), "path": path,
                "lastCommit": {"id": sha, "title": "tiny", "date": "2026-01-01T00:00:00.000Z"}}

    @staticmethod
    def _dir_entry(path: str, sha: str) -> dict:
        return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                "path": path,
                "lastCommit": {"id": sha, "title": "tiny", "date": "2026-01-01T00:00:00.000Z"}}

    def _tree(self, files: dict[str, bytes], base: str, recursive: bool, sha: str) -> list[dict]:
        prefix = base + "/" if base else ""
        entries, dirs = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                d = prefix + "/".join(rest[:depth])
                if d not in dirs and (recursive or depth == 1):
                    dirs.add(d)
                    entries.append(self._dir_entry(d, sha))
            if recursive or len(rest) == 1:
                entries.append(self._file_entry(path, files[path], sha))
        return entries

    def _resolve(self, repo: str, path: str, files: dict[str, bytes], sha: str) -> None:
        if path not in files:
            return self._error(404, "EntryNotFound", f"{path} does not exist on main")
        data = files[path]
        headers = {"ETag": f'"{blob_oid(data)}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        start, end = 0, len(data) - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and self.command == "GET":
            m = re.match(r"bytes=(\d*)-(\d*)$", rng.strip())
            if m:
                if m[1]:
                    start = int(m[1])
                    end = int(m[2]) if m[2] else end
                else:  # bytes=-N: the last N bytes
                    start = max(0, len(data) - int(m[2]))
                end = min(end, len(data) - 1)
                if start > end:
                    headers["Content-Range"] = f"bytes */{len(data)}"
                    return self._send(416, b"", headers)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start:end + 1]
        cut = None
        if self.command == "GET":
            with self.hub.lock:
                cuts = self.hub.cut_next.get((repo, path))
                cut = cuts.pop(0) if cuts else None
        if cut is None:
            return self._send(status, body, headers, "application/octet-stream")
        # promise the whole body, send part of it, and drop the connection
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)
