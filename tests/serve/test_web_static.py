"""The web page's files as the package ships them: every file the page loads is there, nothing points
beyond the server's origin, and only the page's own paths are served without a key."""

from __future__ import annotations

import re

from runtime.serve import web

FILES = web.files()


def test_every_file_the_page_loads_is_shipped() -> None:
    assert {"index.html", "app.js", "api.js", "chat.js", "engine.js", "room.js", "bar.js", "style.css"} <= set(FILES)
    html = FILES["index.html"].decode()
    wanted = set(re.findall(r'(?:src|href)="/ui/([^"]+)"', html))
    for name, body in FILES.items():
        if name.endswith(".js"):
            wanted |= set(re.findall(r'from "\./([^"]+)"', body.decode()))
    assert wanted and wanted <= set(FILES), wanted - set(FILES)


def test_nothing_points_beyond_the_origin() -> None:
    for name, body in FILES.items():
        text = re.sub(r'xmlns="http://www\.w3\.org/2000/svg"', "", body.decode())
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), name
        assert "@import" not in text and "url(" not in text, name


def test_only_the_page_is_public() -> None:
    assert web.is_public("/") and web.is_public("/ui/app.js")
    for path in ("/ui/", "/ui/../v1/sessions", "/ui/a/b.js", "/v1/sessions", "/uix/app.js", "/index.html"):
        assert not web.is_public(path), path
    assert "connect-src 'self'" in web.CSP and "default-src 'none'" in web.CSP
