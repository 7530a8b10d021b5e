"""``bundlefs.integrations.fsspec``: a bundle through real fsspec — every file-system method, the
``bundle`` protocol found through its entry point, chained URLs, and pandas and pyarrow reading a
CSV and a Parquet file inside a bundle."""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
from pathlib import Path

import fsspec
import pytest

from bundlefs import Bundle, NotABundleError, PackOptions, pack
from bundlefs.integrations.fsspec import BundleFileSystem
from tests.conftest import SAMPLE_FILES, SAMPLE_RECORD_SIZE, SAMPLE_SPEC, build_tree

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TABLE = {"id": [1, 2, 3], "label": ["cat", "dog", "émeu"], "score": [0.5, 0.25, 1.0]}


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAMPLE_SPEC plus ``d/t.csv`` and ``d/t.parquet`` (written by pyarrow), packed."""
    src = build_tree(tmp_path_factory.mktemp("fsspec") / "src", SAMPLE_SPEC)
    (src / "d").mkdir()
    table = pa.table(TABLE)
    pq.write_table(table, src / "d" / "t.parquet")
    pd.DataFrame(TABLE).to_csv(src / "d" / "t.csv", index=False)
    os.symlink("t.csv", src / "d" / "csvlink")
    dest = tmp_path_factory.mktemp("fsspec-bundle") / "data.bundle"
    pack(str(src), str(dest), PackOptions(record_size=SAMPLE_RECORD_SIZE))
    shutil.rmtree(src)  # everything below must come out of the bundle
    return dest


@pytest.fixture
def fs(bundle_path: Path) -> BundleFileSystem:
    return fsspec.filesystem("bundle", fo=str(bundle_path))


# --- registration and construction ----------------------------------------------------------------


def test_the_protocol_is_registered_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="fsspec.specs") if e.name == "bundle"]
    assert point.load() is BundleFileSystem
    assert fsspec.get_filesystem_class("bundle") is BundleFileSystem


def test_filesystem_by_protocol_reads_a_file(fs: BundleFileSystem) -> None:
    assert isinstance(fs, BundleFileSystem)
    assert fs.cat("hello.txt") == SAMPLE_FILES["hello.txt"]
    assert fs.cat("bundle://hello.txt") == fs.cat("/hello.txt") == SAMPLE_FILES["hello.txt"]


def test_fo_may_be_a_path_like_a_file_url_or_an_open_bundle(bundle_path: Path) -> None:
    assert BundleFileSystem(fo=bundle_path).cat("dir/a.txt") == b"A" * 100
    assert BundleFileSystem(fo=f"file://{bundle_path}").cat("dir/a.txt") == b"A" * 100
    with Bundle(bundle_path) as b:
        fs = BundleFileSystem(fo=b, skip_instance_cache=True)
        assert fs.bundle is b
        assert fs.cat("dir/b.txt") == b"B" * 200
        fs.close()  # it was handed in open: the caller closes it
        assert not b.closed


def test_a_url_where_no_bundle_is_is_one_clear_error() -> None:
    # Remote bundles open through the object-store read path (tests/store/test_object_store.py);
    # where there is none, the error says so.
    with pytest.raises(NotABundleError, match="memory://.*data.bundle does not exist"):
        fsspec.filesystem("bundle", fo="memory://data.bundle", skip_instance_cache=True)
    with pytest.raises(NotABundleError, match="does not exist"):
        fsspec.open("bundle://x::memory://data.bundle").open()


def test_a_missing_fo_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="needs fo"):
        BundleFileSystem(skip_instance_cache=True)


def test_the_file_system_pickles_and_reopens(fs: BundleFileSystem) -> None:
    copy = pickle.loads(pickle.dumps(fs))
    assert copy.cat("dir/sub/deep.txt") == b"deep down\n"


# --- listing and metadata -------------------------------------------------------------------------


def test_ls_without_detail_lists_names_below_the_path(fs: BundleFileSystem) -> None:
    assert fs.ls("dir", detail=False) == ["dir/a.txt", "dir/b.txt", "dir/hard2", "dir/sub"]
    assert "hello.txt" in fs.ls("", detail=False)
    assert fs.ls("/", detail=False) == fs.ls("", detail=False)
    assert fs.ls("bundle://dir/sub", detail=False) == ["dir/sub/deep.txt", "dir/sub/deeper"]


def test_ls_with_detail_describes_each_child_without_following_symlinks(
    fs: BundleFileSystem,
) -> None:
    rows = {row["name"]: row for row in fs.ls("", detail=True)}
    assert rows["dir"]["type"] == "directory"
    assert rows["hello.txt"]["type"] == "file"
    assert rows["hello.txt"]["size"] == len(SAMPLE_FILES["hello.txt"])
    assert rows["link"]["type"] == "link"
    assert rows["link"]["islink"] and rows["link"]["destination"] == "hello.txt"
    assert rows["dirlink"]["type"] == "link"
    assert rows["dangling"]["type"] == "link"


def test_ls_of_a_file_lists_the_file_and_of_a_symlinked_directory_its_children(
    fs: BundleFileSystem,
) -> None:
    assert fs.ls("hello.txt", detail=False) == ["hello.txt"]
    (row,) = fs.ls("hello.txt", detail=True)
    assert row["name"] == "hello.txt" and row["type"] == "file"
    assert fs.ls("dirlink", detail=False) == [
        "dirlink/a.txt",
        "dirlink/b.txt",
        "dirlink/hard2",
        "dirlink/sub",
    ]


def test_ls_of_a_missing_path_raises_file_not_found(fs: BundleFileSystem) -> None:
    with pytest.raises(FileNotFoundError):
        fs.ls("nope")


def test_info_of_a_file_has_the_stat_fields(fs: BundleFileSystem) -> None:
    info = fs.info("dir/a.txt")
    st = fs.bundle.stat("dir/a.txt")
    assert info["name"] == "dir/a.txt"
    assert info["type"] == "file"
    assert info["size"] == 100
    assert info["mode"] == st.st_mode
    assert info["mtime"] == st.st_mtime
    assert (info["ino"], info["nlink"], info["uid"], info["gid"]) == (
        st.st_ino,
        st.st_nlink,
        st.st_uid,
        st.st_gid,
    )
    assert info["islink"] is False


def test_info_carries_content_type_and_user_data_when_the_bundle_has_them(
    tmp_path: Path,
) -> None:
    src = build_tree(tmp_path / "src", {"x.png": b"\x89PNG\r\n\x1a\n", "raw": b"opaque"})
    labels = {b"x.png": b'{"label":3}', b"raw": b"\xff not json"}
    dest = tmp_path / "b.bundle"
    pack(str(src), str(dest), PackOptions(user_data=lambda rel, _st: labels.get(rel)))
    fs = fsspec.filesystem("bundle", fo=str(dest))
    png = fs.info("x.png")
    assert png["content_type"] == "image/png" and png["user_data"] == {"label": 3}
    raw = fs.info("raw")
    assert "content_type" not in raw and raw["user_data"] == b"\xff not json"
    assert "user_data" not in fs.info("") and "content_type" not in fs.info("")


def test_info_of_a_directory_and_the_root(fs: BundleFileSystem) -> None:
    assert fs.info("dir")["type"] == "directory"
    assert fs.info("dir")["size"] == 0
    root = fs.info("")
    assert root["type"] == "directory" and root["ino"] == 1
    assert fs.info("/") == root


def test_info_follows_a_symlink_and_says_it_was_one(fs: BundleFileSystem) -> None:
    info = fs.info("link")
    assert info["type"] == "file"
    assert info["size"] == len(SAMPLE_FILES["hello.txt"])
    assert info["islink"] is True and info["destination"] == "hello.txt"
    assert fs.info("dirlink")["type"] == "directory"
    dangling = fs.info("dangling")
    assert dangling["type"] == "link" and dangling["destination"] == "does/not/exist"


def test_info_of_a_missing_path_raises_file_not_found(fs: BundleFileSystem) -> None:
    for path in ("nope", "hello.txt/x", "dir/nope"):
        with pytest.raises(FileNotFoundError):
            fs.info(path)


def test_exists_isdir_isfile(fs: BundleFileSystem) -> None:
    assert fs.exists("") and fs.exists("dir") and fs.exists("hello.txt")
    assert fs.exists("dangling")  # as info describes it
    assert not fs.exists("nope") and not fs.exists("hello.txt/x")
    assert fs.isdir("dir") and fs.isdir("dirlink") and fs.isdir("")
    assert not fs.isdir("hello.txt") and not fs.isdir("nope")
    assert fs.isfile("hello.txt") and fs.isfile("link") and fs.isfile("dir/hard2")
    assert not fs.isfile("dir") and not fs.isfile("dangling") and not fs.isfile("nope")


def test_find_lists_every_file_and_never_walks_a_symlink(fs: BundleFileSystem) -> None:
    found = fs.find("")
    assert "dir/sub/deeper/deepest.txt" in found
    assert "d/t.parquet" in found
    assert "link" in found and "dangling" in found  # symlinks are listed, as non-directories
    assert not any(p.startswith("dirlink/") for p in found)
    assert set(SAMPLE_FILES) <= set(found)
    assert fs.find("dir/sub") == ["dir/sub/deep.txt", "dir/sub/deeper/deepest.txt"]
    with_dirs = fs.find("dir", withdirs=True)
    assert "dir/sub" in with_dirs and "dir/sub/deeper" in with_dirs
    detail = fs.find("dir", detail=True)
    assert detail["dir/a.txt"]["size"] == 100


def test_glob(fs: BundleFileSystem) -> None:
    assert fs.glob("dir/*.txt") == ["dir/a.txt", "dir/b.txt"]
    assert fs.glob("**/deep*.txt") == ["dir/sub/deep.txt", "dir/sub/deeper/deepest.txt"]
    assert fs.glob("bundle://d/t.*") == ["d/t.csv", "d/t.parquet"]
    assert fs.glob("nothing*") == []


def test_walk(fs: BundleFileSystem) -> None:
    walked = {top: (sorted(dirs), sorted(files)) for top, dirs, files in fs.walk("dir")}
    assert walked == {
        "dir": (["sub"], ["a.txt", "b.txt", "hard2"]),
        "dir/sub": (["deeper"], ["deep.txt"]),
        "dir/sub/deeper": ([], ["deepest.txt"]),
    }


def test_du(fs: BundleFileSystem) -> None:
    assert fs.du("dir") == 100 + 200 + len(SAMPLE_FILES["dir/hard2"]) + 10 + 7
    per_file = fs.du("dir/sub", total=False)
    assert per_file == {"dir/sub/deep.txt": 10, "dir/sub/deeper/deepest.txt": 7}


# --- content --------------------------------------------------------------------------------------


def test_cat_file_with_start_and_end(fs: BundleFileSystem) -> None:
    big = SAMPLE_FILES["big.bin"]
    cases = [
        (None, None),
        (0, 10),
        (SAMPLE_RECORD_SIZE - 5, SAMPLE_RECORD_SIZE + 5),
        (-100, None),
        (10, -10),
        (None, 3),
        (len(big) - 1, len(big) + 50),
        (len(big) + 5, None),
        (50, 40),
    ]
    for start, end in cases:
        assert fs.cat_file("big.bin", start=start, end=end) == big[start:end], (start, end)


def test_cat_of_several_paths_and_through_a_symlink(fs: BundleFileSystem) -> None:
    assert fs.cat(["dir/a.txt", "dir/b.txt"]) == {"dir/a.txt": b"A" * 100, "dir/b.txt": b"B" * 200}
    assert fs.cat("dir/*.txt") == {"dir/a.txt": b"A" * 100, "dir/b.txt": b"B" * 200}
    assert fs.cat("link") == SAMPLE_FILES["hello.txt"]
    assert fs.cat_file("dirlink/sub/deep.txt", start=5) == b"down\n"
    assert fs.cat("empty") == b""


def test_cat_of_a_directory_or_a_missing_file_raises(fs: BundleFileSystem) -> None:
    with pytest.raises(IsADirectoryError):
        fs.cat_file("dir")
    with pytest.raises(IsADirectoryError):
        fs.cat_file("dir", start=0, end=1)
    with pytest.raises(FileNotFoundError):
        fs.cat_file("nope")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("dangling", start=1)


def test_open_is_seekable_and_reads_only_what_it_is_asked(fs: BundleFileSystem) -> None:
    big = SAMPLE_FILES["big.bin"]
    fs.bundle.cache.clear()
    before = fs.bundle.cache_stats().bytes_loaded
    with fs.open("big.bin", "rb") as f:
        assert f.seekable() and f.readable()
        f.seek(3 * SAMPLE_RECORD_SIZE + 10)
        assert f.read(20) == big[3 * SAMPLE_RECORD_SIZE + 10 :][:20]
        assert f.tell() == 3 * SAMPLE_RECORD_SIZE + 30
        f.seek(-5, io.SEEK_END)
        assert f.read() == big[-5:]
        f.seek(0)
        assert f.read(4) == big[:4]
    loaded = fs.bundle.cache_stats().bytes_loaded - before
    assert 0 < loaded <= 3 * SAMPLE_RECORD_SIZE  # three records touched, not the whole file
    assert loaded < len(big)


def test_open_follows_symlinks_and_reads_text(fs: BundleFileSystem) -> None:
    with fs.open("link", "rb") as f:
        assert f.read() == SAMPLE_FILES["hello.txt"]
    with fs.open("uni-ünï código.txt", "r", encoding="utf-8") as f:
        assert f.read() == "unicode ✓\n"
    with fs.open("lines.txt", "rt", encoding="ascii") as f:
        assert f.readline() == "line 0\n"


def test_open_of_a_directory_or_a_missing_file_raises(fs: BundleFileSystem) -> None:
    with pytest.raises(IsADirectoryError):
        fs.open("dir")
    with pytest.raises(FileNotFoundError):
        fs.open("nope")


# --- read-only ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "write",
    [
        lambda fs: fs.open("new.txt", "wb"),
        lambda fs: fs.open("hello.txt", "ab"),
        lambda fs: fs.pipe("new.txt", b"x"),
        lambda fs: fs.pipe_file("new.txt", b"x"),
        lambda fs: fs.touch("new.txt"),
        lambda fs: fs.mkdir("newdir"),
        lambda fs: fs.makedirs("a/b"),
        lambda fs: fs.rm("hello.txt"),
        lambda fs: fs.rm_file("hello.txt"),
        lambda fs: fs.rmdir("emptydir"),
        lambda fs: fs.cp_file("hello.txt", "copy.txt"),
        lambda fs: fs.mv("hello.txt", "moved.txt"),
        lambda fs: fs.put_file(__file__, "new.py"),
    ],
    ids=[
        "open-wb",
        "open-ab",
        "pipe",
        "pipe_file",
        "touch",
        "mkdir",
        "makedirs",
        "rm",
        "rm_file",
        "rmdir",
        "cp_file",
        "mv",
        "put_file",
    ],
)
def test_every_write_raises_read_only(fs: BundleFileSystem, write) -> None:
    with pytest.raises(OSError) as raised:
        write(fs)
    assert raised.value.errno == errno.EROFS
    assert "read-only" in str(raised.value)
    assert fs.cat("hello.txt") == SAMPLE_FILES["hello.txt"]


# --- URLs -----------------------------------------------------------------------------------------


def test_a_chained_url_opens_a_file_inside_a_local_bundle(bundle_path: Path) -> None:
    with fsspec.open(f"bundle://dir/sub/deep.txt::file://{bundle_path}", "rb") as f:
        assert f.read() == b"deep down\n"
    with fsspec.open(f"bundle://hello.txt::{bundle_path}", "rt", encoding="utf-8") as f:
        assert f.read() == "hello, bundle\n"
    fs, path = fsspec.core.url_to_fs(f"bundle://dir/a.txt::file://{bundle_path}")
    assert isinstance(fs, BundleFileSystem) and path == "dir/a.txt"


def test_open_files_expands_a_glob_inside_a_bundle(bundle_path: Path) -> None:
    files = fsspec.open_files(f"bundle://dir/*.txt::file://{bundle_path}", "rb")
    assert [f.path for f in files] == ["dir/a.txt", "dir/b.txt"]
    with files as handles:
        assert [h.read() for h in handles] == [b"A" * 100, b"B" * 200]


def test_a_url_with_storage_options(bundle_path: Path) -> None:
    with fsspec.open("bundle://dir/b.txt", "rb", fo=str(bundle_path)) as f:
        assert f.read() == b"B" * 200


# --- pandas and pyarrow ---------------------------------------------------------------------------


def test_pandas_reads_a_csv_inside_a_bundle(bundle_path: Path) -> None:
    want = pd.DataFrame(TABLE)
    by_options = pd.read_csv("bundle://d/t.csv", storage_options={"fo": str(bundle_path)})
    pd.testing.assert_frame_equal(by_options, want)
    chained = pd.read_csv(f"bundle://d/t.csv::file://{bundle_path}")
    pd.testing.assert_frame_equal(chained, want)
    through_link = pd.read_csv(f"bundle://d/csvlink::file://{bundle_path}")
    pd.testing.assert_frame_equal(through_link, want)


def test_pandas_reads_a_parquet_file_inside_a_bundle(bundle_path: Path) -> None:
    want = pd.DataFrame(TABLE)
    by_options = pd.read_parquet("bundle://d/t.parquet", storage_options={"fo": str(bundle_path)})
    pd.testing.assert_frame_equal(by_options, want)
    chained = pd.read_parquet(f"bundle://d/t.parquet::file://{bundle_path}")
    pd.testing.assert_frame_equal(chained, want)


def test_pyarrow_reads_parquet_through_the_file_system(fs: BundleFileSystem) -> None:
    table = pq.read_table("d/t.parquet", filesystem=fs)
    assert table.to_pydict() == TABLE
    assert pq.ParquetFile(fs.open("d/t.parquet")).metadata.num_rows == 3
    # pyarrow's own file-system interface over fsspec's: listing, info and random reads.
    from pyarrow.fs import FileSelector, FileType, FSSpecHandler, PyFileSystem

    arrow_fs = PyFileSystem(FSSpecHandler(fs))
    infos = {i.path: i for i in arrow_fs.get_file_info(FileSelector("d"))}
    assert infos["d/t.parquet"].type == FileType.File
    assert infos["d/t.parquet"].size == fs.size("d/t.parquet")
    assert pq.read_table("d/t.parquet", filesystem=arrow_fs).to_pydict() == TABLE


def test_special_files_are_of_type_other_as_fsspecs_local_file_system_says(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "file").write_bytes(b"x")
    os.mkfifo(src / "fifo")
    pack(str(src), str(tmp_path / "b.bundle"))
    fs = BundleFileSystem(fo=tmp_path / "b.bundle", skip_instance_cache=True)
    assert fs.info("fifo")["type"] == fsspec.filesystem("file").info(str(src / "fifo"))["type"]
    assert fs.info("fifo")["type"] == "other" and fs.info("fifo")["size"] == 0
    assert sorted(fs.find("")) == ["fifo", "file"]  # what walk and find list: not a directory
    with Bundle(tmp_path / "b.bundle") as b:
        assert list(b.walk("")) == [("", [], ["fifo", "file"])]
