"""The content-type table (core/content_types.py): the recommended data formats by name and,
where they carry a magic number, by their first bytes."""

from __future__ import annotations

import pytest

from bundlefs.core import content_types


@pytest.mark.parametrize(
    "name, media_type",
    [
        (b"sample.msgpack", "application/msgpack"),
        (b"sample.MPK", "application/msgpack"),
        (b"x.cbor", "application/cbor"),
        (b"x.bson", "application/bson"),
        (b"a.npy", "application/x-npy"),
        (b"a.npz", "application/x-npz"),
        (b"m.safetensors", "application/x-safetensors"),
        (b"t.parquet", "application/vnd.apache.parquet"),
        (b"t.arrow", "application/vnd.apache.arrow.file"),
        (b"t.arrows", "application/vnd.apache.arrow.stream"),
        (b"t.orc", "application/x-orc"),
        (b"t.avro", "application/avro"),
        (b"m.onnx", "application/x-onnx"),
        (b"g.pb", "application/x-protobuf"),
        (b"s.flac", "audio/flac"),
        (b"s.aac", "audio/aac"),
        (b"s.aiff", "audio/aiff"),
        (b"i.webp", "image/webp"),
        (b"i.avif", "image/avif"),
        (b"i.jp2", "image/jp2"),
        (b"i.pgm", "image/x-portable-graymap"),
        (b"d.jsonl", "application/jsonl"),
        (b"m.glb", "model/gltf-binary"),
        (b"m.gltf", "model/gltf+json"),
        (b"p.ply", "model/ply"),
        (b"m.stl", "model/stl"),
    ],
)
def test_the_recommended_formats_are_known_by_their_extension(name: bytes, media_type: str) -> None:
    assert content_types.detect(name, b"") == media_type


@pytest.mark.parametrize(
    "head, media_type",
    [
        (b"Obj\x01\x04\x14avro.schema", "application/avro"),
        (b"\xd9\xd9\xf7\xa1\x61a\x01", "application/cbor"),
        (b"glTF\x02\x00\x00\x00", "model/gltf-binary"),
        (b"ply\nformat ascii 1.0\n", "model/ply"),
        (b"\x76\x2f\x31\x01\x02\x00\x00\x00", "image/x-exr"),
        (b"\x00\x00\x00\x0cjP  \r\n\x87\n\x00\x00", "image/jp2"),
        (b"\x00\x00\x00\x0cJXL \r\n\x87\n\x00\x00", "image/jxl"),
        (b"FORM\x00\x00\x10\x00AIFFCOMM", "audio/aiff"),
        (bytes(128) + b"DICM\x02\x00", "application/dicom"),
        (b"\x93NUMPY\x01\x00", "application/x-npy"),
    ],
)
def test_formats_with_a_magic_number_are_known_without_an_extension(
    head: bytes, media_type: str
) -> None:
    assert content_types.detect(b"no-extension", head) == media_type


def test_msgpack_without_its_name_gets_no_type_and_obj_is_not_guessed() -> None:
    # MessagePack has no magic number: any bytes are a valid start. ``.obj`` is a 3-D model or
    # a compiler's object file.
    assert content_types.detect(b"sample", b"\x82\xa1a\x01\xa1b\x02") is None
    assert content_types.detect(b"main.obj", b"\x64\x86\x01\x00") is None
    assert content_types.detect(b"x", b"FORM\x00\x00\x00\x00ILBM") is None


TEXT_AND_NOT = [
    b"plain text\twith tabs\r\nand lines\f\v",
    "caf\u00e9 cut in the middle".encode()[:4],  # a character cut by the end of the head
    b"\x00binary",
    b"bell \x07",
    b"",
    b"\xff\xfe not utf-8 at all",
]


@pytest.mark.parametrize("head", TEXT_AND_NOT)
def test_text_is_printable_characters_and_whitespace(head: bytes) -> None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        text = head[: e.start].decode("utf-8") if e.start >= len(head) - 3 else "\0"
    printable = all(c.isprintable() or c in "\t\n\r\f\v" for c in text)
    assert content_types.looks_like_text(head) == (bool(head) and printable)


@pytest.mark.parametrize(
    "name", [b"x.pth", b"x.ts", b"no-extension", b"x.json", b"x.png", b"archive"]
)
@pytest.mark.parametrize(
    "head",
    [*TEXT_AND_NOT, b"\x89PNG\r\n\x1a\n", bytes(257) + b"ustar\x0000", b"\x7fELF" + bytes(20)],
)
def test_the_facts_of_a_head_decide_as_the_head_does(name: bytes, head: bytes) -> None:
    facts = content_types.head_facts(head)
    assert content_types.detect(name, facts) == content_types.detect(name, head)


NAMES = [
    *(b"a/x.pth", b"b/y.PTH", b"x.ts", b"no-extension", b".json", b"x.", b"d/x.json"),
    *(b"x.png", b"x.tar.gz", b"x.\xff", b"x.jpg", b"y.jpg", b"d.jpg/plain"),
]


@pytest.mark.parametrize("detect", [True, False], ids=["detect", "no-detect"])
@pytest.mark.parametrize("rules", [(), (("d/*", "text/x-d"), ("*.jpg", ""))], ids=["", "rules"])
def test_by_name_chooses_as_choose_with_no_head_does(detect: bool, rules: tuple) -> None:
    remembering = content_types.ContentTypeRules(rules, detect=detect)
    for name in NAMES * 2:  # the second time from what it remembered
        fresh = content_types.ContentTypeRules(rules, detect=detect)
        assert remembering.by_name(name) == fresh.choose(name, b""), name
