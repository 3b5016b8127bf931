"""The S3 credentials file (protocol.s3.credentials) and a key's scope."""

from __future__ import annotations

import pytest

from protocol.s3.credentials import S3Key, parse_credentials

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"


def test_a_good_file() -> None:
    keys = parse_credentials(
        "# keys of the training cluster\n"
        "\n"
        f"AKIATRAIN0000001  {SECRET}  ds/train,ds/eval/\n"
        f"   ADMIN.key_2\t{SECRET[::-1]}\t''   \n"
        f"EMPTY-DQ {SECRET} \"\"\n"
        "  # an indented comment\n"
    )
    assert sorted(keys) == ["ADMIN.key_2", "AKIATRAIN0000001", "EMPTY-DQ"]
    assert keys["AKIATRAIN0000001"] == S3Key("AKIATRAIN0000001", SECRET, ("ds/train", "ds/eval/"))
    assert keys["ADMIN.key_2"].prefixes == ("",)
    assert keys["ADMIN.key_2"].secret == SECRET[::-1]
    assert keys["EMPTY-DQ"].prefixes == ("",)


def test_an_empty_file_has_no_keys() -> None:
    assert parse_credentials("") == {}
    assert parse_credentials("# nothing\n\n") == {}


def test_the_secret_stays_out_of_repr() -> None:
    key = S3Key("AK", SECRET, ("",))
    assert SECRET not in repr(key)
    assert "AK" in repr(key)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"AK {SECRET}", "got 2 fields"),
        ("AK", "fields"),
        (f"AK {SECRET} ds extra", "got 4 fields"),
        (f"AK/1 {SECRET} ds", "access key id"),
        (f"AK,1 {SECRET} ds", "access key id"),
        ("AK short ds", "shorter than 16 bytes"),
        (f"AK {SECRET} ds,,eval", "written ''"),
        (f"AK {SECRET} ds,", "written ''"),
        (f"AK {SECRET} ds/../etc", "bad prefix"),
        (f"AK {SECRET} ds//x", "bad prefix"),
        (f"AK {SECRET} ds/%2e%2e/x", "bad prefix"),
        (f"AK {SECRET} {','.join(['p'] * 257)}", "more than 256 prefixes"),
        (f"{'A' * 129} {SECRET} ds", "access key id"),
    ],
)
def test_bad_lines_name_their_number(text: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_credentials(f"# header\n\nOK {SECRET} ds\n{text}\n")
    assert str(caught.value).startswith("line 4: ")
    assert words in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_key_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^line 2: access key AK is listed twice"):
        parse_credentials(f"AK {SECRET} ds\nAK {SECRET} eval\n")


@pytest.mark.parametrize(
    ("prefixes", "path", "allowed"),
    [
        (("ds/train",), "ds/train/a", True),
        (("ds/train",), "ds/train", True),
        (("ds/train",), "ds/training/a", False),
        (("ds/train/",), "ds/train/a", True),
        (("ds/train/",), "ds/training/a", False),
        (("ds/train",), "ds/trai", False),
        (("ds",), "ds/x/y/z", True),
        (("ds",), "dsx/a", False),
        (("ds",), "other/a", False),
        (("",), "anything/at/all", True),
        (("ds/a.bin",), "ds/a.bin", True),
        (("ds/a.bin",), "ds/a.bin2", False),
        (("eval", "ds/train"), "eval/e", True),
        (("eval", "ds/train"), "ds/eval/e", False),
    ],
)
def test_allows_matches_whole_segments(prefixes: tuple[str, ...], path: str, allowed: bool) -> None:
    assert S3Key("AK", SECRET, prefixes).allows(path) is allowed


@pytest.mark.parametrize(
    ("prefixes", "listing", "allowed"),
    [
        (("ds/",), "ds", True),
        (("ds/",), "ds/", True),
        (("ds/",), "ds/shard-0", True),
        (("ds/",), "", False),
        (("ds/",), "d", False),
        (("ds/train",), "ds/", False),
        (("ds/train",), "ds/train/", True),
        (("ds/train",), "ds/training", False),
        (("",), "", True),
        (("",), "anything", True),
    ],
)
def test_allows_listing(prefixes: tuple[str, ...], listing: str, allowed: bool) -> None:
    assert S3Key("AK", SECRET, prefixes).allows_listing(listing) is allowed


def test_parsed_keys_scope_like_the_file_says() -> None:
    keys = parse_credentials(f"AK {SECRET} ds/train,eval\n")
    key = keys["AK"]
    assert key.allows("ds/train/x.bin")
    assert key.allows("eval/y")
    assert not key.allows("ds/training/x.bin")
    assert not key.allows("ds/other")
