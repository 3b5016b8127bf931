"""Byte ranges over real HTTP, against the hub and the spoke alike (RFC 9110 §14).

Every semantic test runs through the ``server`` fixture, once per server: a loader
must see the same status, headers and bytes from either.
"""

from __future__ import annotations

import random
import re
import secrets
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from tests.conftest import CHUNK, FILES, SpokeFactory
from tests.support.http import assert_problem, fetch
from tests.support.servers import RunningServer
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]

BIG = "ds/big.bin"
PARTIAL = "ds/partial.bin"
BIG_SIZE = FILES[BIG]
PARTIAL_SIZE = FILES[PARTIAL]
SEED = 20240611


def expected(spec: str, size: int) -> tuple[int, int]:
    """The half-open ``[start, stop)`` a satisfiable single range-spec selects."""
    first, _, last = spec.partition("-")
    if not first:
        return max(0, size - int(last)), size
    return int(first), size if not last else min(int(last) + 1, size)


def random_specs(rng: random.Random, size: int, count: int) -> list[str]:
    """``count`` satisfiable range-specs over ``size`` bytes in all three forms."""
    specs = []
    for _ in range(count):
        form = rng.choice(("a-b", "a-b", "a-", "-n"))
        if form == "-n":
            specs.append(f"-{rng.randint(1, size + CHUNK)}")
            continue
        start = rng.randrange(size)
        if form == "a-":
            specs.append(f"{start}-")
            continue
        # Mostly short reads (a sample or two), some spanning many chunks, and some
        # whose last position runs past the end of the object.
        length = rng.choice((rng.randint(1, 4096), rng.randint(1, 6 * CHUNK), size))
        specs.append(f"{start}-{start + length - 1}")
    return specs


def boundary_specs(size: int) -> list[str]:
    last = size - 1
    return [
        "0-0",  # first byte
        f"{last}-{last}",  # last byte
        f"{last}-",
        "-1",
        f"{CHUNK - 1}-{CHUNK}",  # the two bytes either side of the first chunk boundary
        f"{CHUNK - 1}-{CHUNK - 1}",
        f"{CHUNK}-{CHUNK}",
        f"0-{CHUNK - 1}",  # exactly one chunk
        f"{CHUNK}-{2 * CHUNK - 1}",
        f"{CHUNK - 1}-{3 * CHUNK}",  # straddles three boundaries
        f"1-{last - 1}",  # everything but the first and last byte
        f"{(size // CHUNK) * CHUNK}-",  # exactly the last (partial) chunk
        f"-{size - (size // CHUNK) * CHUNK}",  # the same, as a suffix
        f"{(size // CHUNK) * CHUNK - 1}-{(size // CHUNK) * CHUNK}",
        f"0-{last}",
        f"0-{last + 1000}",
    ]


async def test_random_and_boundary_ranges_are_byte_exact(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    rng = random.Random(SEED)
    cases = [(BIG, s) for s in random_specs(rng, BIG_SIZE, 120) + boundary_specs(BIG_SIZE)]
    cases += [
        (PARTIAL, s) for s in random_specs(rng, PARTIAL_SIZE, 80) + boundary_specs(PARTIAL_SIZE)
    ]
    assert len(cases) == 232
    for path, spec in cases:
        data = files[path]
        start, stop = expected(spec, len(data))
        status, headers, body = await fetch(
            http, f"{server.url}/objects/{path}", {"Range": f"bytes={spec}"}
        )
        assert status == 206, (path, spec)
        assert headers["Content-Range"] == f"bytes {start}-{stop - 1}/{len(data)}", (path, spec)
        assert headers["Content-Length"] == str(stop - start), (path, spec)
        assert headers["Accept-Ranges"] == "bytes"
        assert body == data[start:stop], (path, spec)


@pytest.mark.parametrize("path", sorted(p for p, n in FILES.items() if n > 0))
async def test_suffix_longer_than_object_is_the_whole_object(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, path: str
) -> None:
    data = dataset[1][path]
    n = len(data)
    status, headers, body = await fetch(
        http, f"{server.url}/objects/{path}", {"Range": f"bytes=-{n + 12345}"}
    )
    assert status == 206
    assert headers["Content-Range"] == f"bytes 0-{n - 1}/{n}"
    assert headers["Content-Length"] == str(n)
    assert body == data


@pytest.mark.parametrize("path", sorted(FILES))
async def test_whole_object_get_and_head(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, path: str
) -> None:
    data = dataset[1][path]
    status, headers, body = await fetch(http, f"{server.url}/objects/{path}")
    assert status == 200
    assert body == data
    assert headers["Content-Length"] == str(len(data))
    assert headers["Accept-Ranges"] == "bytes"
    assert "Content-Range" not in headers
    assert re.fullmatch(r'"[!#-~]+"', headers["ETag"])
    expected_type = "text/csv" if path.endswith(".csv") else "application/octet-stream"
    assert headers["Content-Type"] == expected_type

    head_status, head_headers, head_body = await fetch(
        http, f"{server.url}/objects/{path}", method="HEAD"
    )
    assert head_status == 200
    assert head_body == b""
    for name in ("ETag", "Last-Modified", "Content-Length", "Content-Type", "Accept-Ranges"):
        assert head_headers[name] == headers[name], name


async def test_head_ignores_range(server: RunningServer, http: aiohttp.ClientSession) -> None:
    """RFC 9110 §14.2: range handling is defined for GET only; HEAD gets the 200 headers."""
    status, headers, body = await fetch(
        http, f"{server.url}/objects/{BIG}", {"Range": "bytes=100-199"}, method="HEAD"
    )
    assert status == 200
    assert body == b""
    assert "Content-Range" not in headers
    assert headers["Content-Length"] == str(BIG_SIZE)


@pytest.mark.parametrize(
    ("header", "content_range", "start", "stop"),
    [
        ("bytes=0-" + "9" * 30, "bytes 0-999/1000", 0, 1000),
        ("bytes=-" + "9" * 30, "bytes 0-999/1000", 0, 1000),
        ("Bytes=0-1", "bytes 0-1/1000", 0, 2),  # range units are case-insensitive
        ("bytes= 3-4 ", "bytes 3-4/1000", 3, 5),
        ("bytes=0-9,,", "bytes 0-9/1000", 0, 10),  # empty list elements are ignored
    ],
)
async def test_lenient_but_valid_range_headers(
    server: RunningServer,
    dataset: Dataset,
    http: aiohttp.ClientSession,
    header: str,
    content_range: str,
    start: int,
    stop: int,
) -> None:
    data = dataset[1]["ds/small.bin"]
    status, headers, body = await fetch(
        http, f"{server.url}/objects/ds/small.bin", {"Range": header}
    )
    assert (status, headers["Content-Range"], body) == (206, content_range, data[start:stop])


async def test_small_object_ranges(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """Objects smaller than one chunk: ranges clip to the object's end."""
    small = dataset[1]["ds/small.bin"]
    one = dataset[1]["ds/one-byte.bin"]
    cases = [
        ("ds/small.bin", "bytes=10-19", 206, "bytes 10-19/1000", small[10:20]),
        ("ds/small.bin", "bytes=990-5000", 206, "bytes 990-999/1000", small[990:]),
        ("ds/small.bin", "bytes=-10", 206, "bytes 990-999/1000", small[990:]),
        ("ds/small.bin", "bytes=999-", 206, "bytes 999-999/1000", small[999:]),
        ("ds/one-byte.bin", "bytes=0-0", 206, "bytes 0-0/1", one),
        ("ds/one-byte.bin", "bytes=0-", 206, "bytes 0-0/1", one),
        ("ds/one-byte.bin", "bytes=-1", 206, "bytes 0-0/1", one),
    ]
    for path, header, code, content_range, data in cases:
        status, headers, body = await fetch(
            http, f"{server.url}/objects/{path}", {"Range": header}
        )
        assert (status, headers["Content-Range"], body) == (code, content_range, data), header


async def test_empty_object(server: RunningServer, http: aiohttp.ClientSession) -> None:
    url = f"{server.url}/objects/ds/empty.bin"
    status, headers, body = await fetch(http, url)
    assert (status, body, headers["Content-Length"]) == (200, b"", "0")
    # No range can overlap zero bytes (RFC 9110 §14.1.2): every form is 416.
    for spec in ("0-0", "0-", "-1", "-100", "5-10"):
        status, headers, body = await fetch(http, url, {"Range": f"bytes={spec}"})
        assert_problem((status, headers, body), 416)
        assert headers["Content-Range"] == "bytes */0", spec


@pytest.mark.parametrize(
    ("path", "spec"),
    [
        (BIG, f"{BIG_SIZE}-"),
        (BIG, f"{BIG_SIZE}-{BIG_SIZE + 10}"),
        (BIG, f"{BIG_SIZE + 1000}-"),
        (PARTIAL, f"{PARTIAL_SIZE}-{PARTIAL_SIZE}"),
        ("ds/small.bin", "1000-"),
        ("ds/small.bin", "-0"),
        ("ds/one-byte.bin", "1-1"),
        ("ds/small.bin", "5000-6000,1000-"),
        ("ds/small.bin", "9" * 30 + "-"),
    ],
)
async def test_unsatisfiable_range_is_416(
    server: RunningServer, http: aiohttp.ClientSession, path: str, spec: str
) -> None:
    status, headers, body = await fetch(
        http, f"{server.url}/objects/{path}", {"Range": f"bytes={spec}"}
    )
    assert_problem((status, headers, body), 416)
    assert headers["Content-Range"] == f"bytes */{FILES[path]}"


@pytest.mark.parametrize(
    "header",
    [
        "bytes=abc",
        "items=0-1",
        "bytes=5-2",
        "bytes=",
        "bytes=-",
        "bytes 0-1",
        "bytes=0-1,x-y",
        "bytes=1-2-3",
        "bytes=-1-2",
        "bytes=+1-2",
        "bytes=0x10-0x20",
        "bytes=\u00b2-3",  # '²' is a digit to str.isdigit(), not to HTTP
        "bytes=0-" + "9" * 5000,  # more digits than int() accepts by default
    ],
)
async def test_unparseable_range_is_ignored(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, header: str
) -> None:
    data = dataset[1]["ds/small.bin"]
    status, headers, body = await fetch(
        http, f"{server.url}/objects/ds/small.bin", {"Range": header}
    )
    assert status == 200
    assert "Content-Range" not in headers
    assert headers["Content-Length"] == "1000"
    assert body == data


def parse_byteranges(content_type: str, body: bytes) -> list[tuple[str, str, bytes]]:
    """Split a multipart/byteranges body strictly; returns (Content-Type, Content-Range, bytes).

    Each part's length comes from its own Content-Range, so random object bytes can
    never be mistaken for a delimiter.
    """
    media, _, params = content_type.partition(";")
    assert media.strip() == "multipart/byteranges"
    match = re.fullmatch(r"\s*boundary=\"?([^\";]+)\"?\s*", params)
    assert match is not None, content_type
    delimiter = b"--" + match.group(1).encode("ascii")
    parts: list[tuple[str, str, bytes]] = []
    pos = 0
    while True:
        assert body.startswith(delimiter, pos), pos
        pos += len(delimiter)
        if body.startswith(b"--\r\n", pos):
            assert pos + 4 == len(body), "bytes after the closing delimiter"
            return parts
        assert body.startswith(b"\r\n", pos)
        head_end = body.index(b"\r\n\r\n", pos)
        fields = {}
        for line in body[pos + 2 : head_end].decode("ascii").split("\r\n"):
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        found = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", fields["content-range"])
        assert found is not None, fields
        length = int(found.group(2)) - int(found.group(1)) + 1
        start = head_end + 4
        part = body[start : start + length]
        parts.append((fields["content-type"], fields["content-range"], part))
        pos = start + length
        assert body.startswith(b"\r\n", pos)
        pos += 2


async def test_multiple_ranges_are_multipart_byteranges(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1][BIG]
    n = len(data)
    # Disjoint ranges keep the order they were asked in.
    header = f"bytes=500-599, 0-9,{CHUNK - 5}-{CHUNK + 4},{10 * CHUNK}-{13 * CHUNK + 2},-7"
    status, headers, body = await fetch(http, f"{server.url}/objects/{BIG}", {"Range": header})
    assert status == 206
    assert "Content-Range" not in headers
    assert headers["Content-Length"] == str(len(body))
    parts = parse_byteranges(headers["Content-Type"], body)
    want = [(500, 600), (0, 10), (CHUNK - 5, CHUNK + 5), (10 * CHUNK, 13 * CHUNK + 3), (n - 7, n)]
    assert [(ct, cr) for ct, cr, _ in parts] == [
        ("application/octet-stream", f"bytes {a}-{b - 1}/{n}") for a, b in want
    ]
    assert [p for _, _, p in parts] == [data[a:b] for a, b in want]


async def test_multipart_of_csv_names_its_type_in_each_part(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1]["other/notes.csv"]
    status, headers, body = await fetch(
        http, f"{server.url}/objects/other/notes.csv", {"Range": "bytes=0-1,2998-"}
    )
    assert status == 206
    parts = parse_byteranges(headers["Content-Type"], body)
    assert parts == [
        ("text/csv", "bytes 0-1/3000", data[0:2]),
        ("text/csv", "bytes 2998-2999/3000", data[2998:]),
    ]


async def test_unsatisfiable_ranges_among_satisfiable_ones_are_dropped(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1]["ds/small.bin"]
    status, headers, body = await fetch(
        http, f"{server.url}/objects/ds/small.bin", {"Range": "bytes=5000-,10-19,2000-3000"}
    )
    assert status == 206
    assert headers["Content-Range"] == "bytes 10-19/1000"
    assert body == data[10:20]


async def test_overlapping_ranges_are_coalesced(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1][BIG]
    n = len(data)
    url = f"{server.url}/objects/{BIG}"

    # Overlaps merge into one range: a plain single-part 206.
    status, headers, body = await fetch(http, url, {"Range": "bytes=0-99,50-149,100-120"})
    assert status == 206
    assert headers["Content-Range"] == f"bytes 0-149/{n}"
    assert body == data[:150]

    # Overlapping and adjacent ranges merge; what is left is sorted, never repeated.
    header = f"bytes=1000-1099,{CHUNK}-{CHUNK + 9},0-99,1050-1199,1200-1209,-10,{n - 20}-"
    status, headers, body = await fetch(http, url, {"Range": header})
    assert status == 206
    parts = parse_byteranges(headers["Content-Type"], body)
    want = [(0, 100), (1000, 1210), (CHUNK, CHUNK + 10), (n - 20, n)]
    assert [cr for _, cr, _ in parts] == [f"bytes {a}-{b - 1}/{n}" for a, b in want]
    assert [p for _, _, p in parts] == [data[a:b] for a, b in want]
    assert sum(len(p) for _, _, p in parts) == 100 + 210 + 10 + 20


async def test_a_thousand_ranges_is_416_and_the_server_carries_on(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """RFC 9110 §15.5.17: too many ranges is a 416 with the size, not a 400."""
    data = dataset[1][BIG]
    url = f"{server.url}/objects/{BIG}"
    header = "bytes=" + ",".join(f"{i}-{i}" for i in range(1000))
    for _ in range(2):  # the object unknown to a spoke, then known and cached
        status, headers, body = await fetch(http, url, {"Range": header})
        assert_problem((status, headers, body), 416)
        assert headers["Content-Range"] == f"bytes */{len(data)}"
        await fetch(http, url)
    # The server is fine afterwards and still sends the right bytes.
    n = len(data)
    after = [(f"{3 * CHUNK}-{4 * CHUNK}", 3 * CHUNK, 4 * CHUNK + 1), ("-3", n - 3, n)]
    for spec, a, b in after:
        status, headers, body = await fetch(http, url, {"Range": f"bytes={spec}"})
        assert (status, headers["Content-Range"]) == (206, f"bytes {a}-{b - 1}/{n}")
        assert body == data[a:b]


async def test_257_ranges_are_416_on_the_aiohttp_routes_too(
    server: RunningServer, dataset: Dataset
) -> None:
    """A spoke connection that has been handed to aiohttp (a /healthz first) answers
    its object reads there, not on the fast path: the same 416."""
    header = "bytes=" + ",".join(f"{i * 100}-{i * 100 + 9}" for i in range(257))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        assert (await fetch(one, f"{server.url}/healthz"))[0] == 200
        status, headers, body = await fetch(one, f"{server.url}/objects/{BIG}", {"Range": header})
    assert_problem((status, headers, body), 416)
    assert headers["Content-Range"] == f"bytes */{len(dataset[1][BIG])}"


async def test_256_ranges_are_served(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """The cap is above what a batching loader sends: 256 disjoint ranges are fine."""
    data = dataset[1][BIG]
    want = [(i * 10_000, i * 10_000 + 17) for i in range(256)]
    header = "bytes=" + ",".join(f"{a}-{b - 1}" for a, b in want)
    status, headers, body = await fetch(http, f"{server.url}/objects/{BIG}", {"Range": header})
    assert status == 206
    parts = parse_byteranges(headers["Content-Type"], body)
    assert [p for _, _, p in parts] == [data[a:b] for a, b in want]


async def test_a_thousand_realistic_ranges_is_416_problem_json(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """1000 ranges at realistic offsets (~16 KB of header) must still be problem+json."""
    data = dataset[1][BIG]
    header = "bytes=" + ",".join(f"{i * 2600}-{i * 2600 + 99}" for i in range(1000))
    assert 8190 < len(header) < 20_000
    status, headers, body = await fetch(http, f"{server.url}/objects/{BIG}", {"Range": header})
    assert status == 416
    status2, _, body2 = await fetch(http, f"{server.url}/objects/{BIG}", {"Range": "bytes=0-9"})
    assert (status2, body2) == (206, data[:10])
    assert_problem((status, headers, body), 416)


async def test_hub_and_spoke_send_identical_headers(
    hub: RunningServer, spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    compared = (
        "ETag", "Last-Modified", "Content-Length", "Content-Range", "Content-Type",
        "Accept-Ranges",
    )
    requests: list[tuple[str, str, dict[str, str]]] = [
        (BIG, "GET", {}),
        (BIG, "HEAD", {}),
        (BIG, "GET", {"Range": f"bytes={CHUNK - 1}-{5 * CHUNK}"}),
        (BIG, "GET", {"Range": "bytes=-100"}),
        (BIG, "HEAD", {"Range": "bytes=10-"}),
        (PARTIAL, "GET", {"Range": f"bytes=-{10 * PARTIAL_SIZE}"}),
        ("ds/empty.bin", "GET", {}),
        ("ds/one-byte.bin", "GET", {"Range": "bytes=0-0"}),
        ("other/notes.csv", "GET", {}),
        ("other/notes.csv", "GET", {"Range": "bytes=0-1,10-20"}),
        ("ds/small.bin", "GET", {"Range": "bytes=2000-"}),
        ("ds/small.bin", "GET", {"Range": "bytes=abc"}),
    ]
    seen_x_cache = []
    for path, method, headers in requests:
        h_status, h_headers, h_body = await fetch(
            http, f"{hub.url}/objects/{path}", headers, method
        )
        s_status, s_headers, s_body = await fetch(
            http, f"{spoke.url}/objects/{path}", headers, method
        )
        assert h_status == s_status, (path, method, headers)
        assert "X-Cache" not in h_headers
        if h_status < 400:
            seen_x_cache.append(s_headers["X-Cache"])
        for name in compared:
            h_value, s_value = h_headers.get(name), s_headers.get(name)
            if name == "Content-Type" and h_value and h_value.startswith("multipart/"):
                # The boundary is random per response; everything else must match.
                h_value, s_value = h_value.split(";")[0], (s_value or "").split(";")[0]
            assert h_value == s_value, (name, path, method, headers)
        if "multipart/" not in h_headers.get("Content-Type", ""):
            assert h_body == s_body
    # The first whole read fetched every chunk; the HEAD and later reads of big.bin hit.
    assert seen_x_cache[:5] == ["MISS", "HIT", "HIT", "HIT", "HIT"]
    assert set(seen_x_cache) <= {"HIT", "MISS", "PARTIAL"}


async def test_spoke_reports_partial_when_some_chunks_are_cached(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1][BIG]
    url = f"{spoke.url}/objects/{BIG}"
    first = await fetch(http, url, {"Range": f"bytes=0-{CHUNK - 1}"})
    second = await fetch(http, url, {"Range": f"bytes=0-{2 * CHUNK - 1}"})
    third = await fetch(http, url, {"Range": f"bytes=10-{2 * CHUNK - 10}"})
    assert [r[1]["X-Cache"] for r in (first, second, third)] == ["MISS", "PARTIAL", "HIT"]
    assert first[2] == data[:CHUNK]
    assert second[2] == data[: 2 * CHUNK]
    assert third[2] == data[10 : 2 * CHUNK - 9]


def boundary_in(content_type: str) -> str:
    match = re.search(r"boundary=\"?([^\";]+)\"?", content_type)
    assert match is not None, content_type
    return match.group(1)


async def test_multipart_boundaries_are_fresh_randomness_per_response(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """#20.8: no per-process prefix and counter that one answer gives away for the next."""
    seen = []
    for _ in range(20):
        status, headers, _ = await fetch(
            http, f"{server.url}/objects/{BIG}", {"Range": "bytes=0-9,100-109"}
        )
        assert status == 206
        seen.append(boundary_in(headers["Content-Type"]))
    assert all(re.fullmatch(r"[0-9a-f]{24}", b) for b in seen), seen
    assert len({b[:8] for b in seen}) == len(seen)  # no shared prefix
    assert len({b[-8:] for b in seen}) == len(seen)  # no counter at the end either


PLANTED = "0123456789abcdef01234567"


@pytest.fixture
def planted(dataset: Dataset, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    """An object holding ``--PLANTED`` three times (one across a chunk boundary), and a
    CSPRNG whose first two boundaries are PLANTED: what someone who could predict the
    boundary would put in an object."""
    needle = b"--" + PLANTED.encode()
    data = bytearray(random.Random(SEED).randbytes(3 * CHUNK))
    for offset in (100, CHUNK - 10, 2 * CHUNK + 500):
        data[offset:offset + len(needle)] = needle
    (dataset[0] / "planted.bin").write_bytes(data)
    real = secrets.token_hex
    drawn = iter(range(2))

    def token_hex(nbytes: int | None = None) -> str:
        if nbytes == 12 and next(drawn, None) is not None:
            return PLANTED
        return real(nbytes)

    monkeypatch.setattr(secrets, "token_hex", token_hex)
    return "planted.bin", bytes(data)


PLANTED_RANGES = [(50, 199), (CHUNK - 20, CHUNK + 20), (2 * CHUNK, 2 * CHUNK + 999)]


def assert_framed_clear_of_its_data(
    headers: CIMultiDictProxy[str], body: bytes, data: bytes
) -> None:
    boundary = boundary_in(headers["Content-Type"])
    assert boundary != PLANTED
    parts = parse_byteranges(headers["Content-Type"], body)
    assert [(crange, part) for _, crange, part in parts] == [
        (f"bytes {a}-{b}/{len(data)}", data[a:b + 1]) for a, b in PLANTED_RANGES
    ]
    # Split on the delimiter, as a parser that does not count bytes would: the parts.
    pieces = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    assert len(pieces) == len(PLANTED_RANGES) + 2


@pytest.mark.parametrize("which", ["hub", "spoke, cached"])
async def test_a_boundary_that_occurs_in_the_parts_is_never_the_answers(
    which: str, hub: RunningServer, make_spoke: SpokeFactory, planted: tuple[str, bytes],
    http: aiohttp.ClientSession,
) -> None:
    path, data = planted
    server = hub if which == "hub" else await make_spoke()
    url = f"{server.url}/objects/{path}"
    if which != "hub":
        assert (await fetch(http, url))[2] == data
        await settled_stats(http, server.url)  # every chunk on disk: the in-callback path
    header = "bytes=" + ",".join(f"{a}-{b}" for a, b in PLANTED_RANGES)
    # A new connection: /stats handed the last one to aiohttp's routes, which stream.
    async with aiohttp.ClientSession() as fresh:
        status, headers, body = await fetch(fresh, url, {"Range": header})
    assert status == 206
    assert_framed_clear_of_its_data(headers, body, data)


@pytest.mark.parametrize("via", ["fast path", "aiohttp"])
async def test_a_streamed_answer_is_cut_before_its_boundary_would_go_out(
    via: str, make_spoke: SpokeFactory, planted: tuple[str, bytes],
) -> None:
    """Chunks not cached yet go out as they arrive, after the head: a part that holds
    the boundary cuts the answer rather than being sent (the retry gets a new one)."""
    path, data = planted
    spoke = await make_spoke()
    header = "bytes=" + ",".join(f"{a}-{b}" for a, b in PLANTED_RANGES)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        if via == "aiohttp":
            assert (await fetch(one, f"{spoke.url}/healthz"))[0] == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await fetch(one, f"{spoke.url}/objects/{path}", {"Range": header})
    assert secrets.token_hex(12) == PLANTED  # the second planted draw, not the retry's
    async with aiohttp.ClientSession() as http:  # the retry: a fresh boundary
        status, headers, body = await fetch(http, f"{spoke.url}/objects/{path}", {"Range": header})
    assert status == 206
    assert_framed_clear_of_its_data(headers, body, data)
